"""The ``rte`` command: thin subcommands over the engine, the daemon and the tools.

rte serve       run the engine daemon (the product)
rte demo        launch a daemon, stream sessions from a client, show rates
rte inspect     read live daemons' rings, slab and counters
rte bench       the benchmarks of a source checkout (tools/)
"""

from __future__ import annotations

import argparse
import sys

import rte
from rte.cli import bench, demo, inspect, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rte", description="A realtime inference engine.")
    parser.add_argument("--version", action="version", version=f"rte {rte.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (serve, demo, inspect, bench):
        command.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
