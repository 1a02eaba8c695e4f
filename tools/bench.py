"""Run the benchmark suites and print their tables (or JSON): ``rte bench``.

    python -m tools.bench [--suite engine|e2e|transport|all] [--json] [--quick] [--plot FILE.png]

Run from a checkout (``tools`` is never installed); ``rte bench`` finds the
checkout and runs this.
"""

from __future__ import annotations

import argparse

from tools import bench_e2e, bench_engine, bench_transport


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=["engine", "e2e", "transport", "all"], default="all")
    parser.add_argument("--plot", metavar="FILE.png", help="plot the end-to-end latencies")
    parser.add_argument("--json", action="store_true", help="JSON instead of tables")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = parser.parse_args(argv)
    flags = ["--json"] if args.json else []
    if args.suite in ("engine", "all"):
        bench_engine.main(flags + (["--steps", "300"] if args.quick else []))
    if args.suite in ("e2e", "all"):
        extra = (["--rounds", "60"] if args.quick else []) + (
            ["--plot", args.plot] if args.plot else []
        )
        bench_e2e.main(flags + extra)
    if args.suite in ("transport", "all"):
        bench_transport.main(flags + (["--quick"] if args.quick else []))


if __name__ == "__main__":
    main()
