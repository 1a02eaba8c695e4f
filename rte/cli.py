"""The ``rte`` command.

rte serve       run the engine daemon (the product)
rte demo        launch a daemon, stream sessions from a client, show rates
rte inspect     read live daemons' rings, slab and counters (tools/inspector.py)
rte bench       the benchmarks in tools/ (engine, end to end, transport)
"""

from __future__ import annotations

import argparse
import logging
import sys

from rte.demo import demo


def serve(args: argparse.Namespace) -> int:
    """Run the engine daemon in the foreground until SIGTERM or Ctrl-C."""
    from rte.daemon import DaemonRunningError, Settings  # noqa: PLC0415
    from rte.daemon import serve as run_daemon  # noqa: PLC0415

    logging.basicConfig(level=logging.INFO, format="rte serve: %(levelname)s %(message)s")
    settings = Settings(
        name=args.name,
        model=args.model,
        max_sessions=args.max_sessions,
        max_clients=args.max_clients,
        ring_kib=args.ring_kib,
        slab_slots=args.slab_slots,
        quota=args.quota,
        pace_hz=args.pace_hz,
        wait_policy=args.wait_policy,
        idle_limit_s=args.idle_limit_s,
    )
    try:
        run_daemon(settings)
    except DaemonRunningError as exc:
        print(f"rte serve: {exc}", file=sys.stderr)
        return 2
    print(f"rte serve: {args.name} stopped; its shared memory is unlinked", file=sys.stderr)
    return 0


def inspect(args: argparse.Namespace) -> int:
    """The debug tool (tools/inspector.py); its own options follow."""
    from tools import inspector  # noqa: PLC0415 (only this command needs it)

    return inspector.main(args.rest)


def bench(args: argparse.Namespace) -> int:
    """Run the benchmark suites in ``tools/`` (each prints its own table or JSON)."""
    from tools import bench_e2e, bench_engine, bench_transport  # noqa: PLC0415 (this only)

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
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rte", description="realtime inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the engine daemon in the foreground")
    p.add_argument("--name", required=True, help="the daemon's name (clients connect by it)")
    p.add_argument("--model", default="reference", help="short name or module:factory")
    p.add_argument("--max-sessions", type=int, default=8)
    p.add_argument("--max-clients", type=int, default=8)
    p.add_argument("--ring-kib", type=int, default=256, help="each client ring's size")
    p.add_argument("--slab-slots", type=int, default=64)
    p.add_argument("--quota", type=int, default=0, help="slots per client (0: an even share)")
    p.add_argument("--pace-hz", type=float, default=0.0, help="steps per second (0: flat out)")
    p.add_argument(
        "--wait-policy", default="spin-then-block", choices=["spin", "spin-then-block", "block"]
    )
    p.add_argument("--idle-limit-s", type=float, default=30.0)
    p.set_defaults(func=serve)
    p = sub.add_parser("demo", help="launch a daemon, stream sessions from a client, show rates")
    p.add_argument("--name", help="attach to this running daemon instead of launching one")
    p.add_argument("--model", default="reference", help="short name or module:factory")
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--png", help="write a contact sheet of decoded frames to this PNG file")
    p.set_defaults(func=demo)
    p = sub.add_parser("inspect", help="read a daemon's rings, slab and counters", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=inspect)
    p = sub.add_parser("bench", help="run the benchmarks and print their tables")
    p.add_argument("--suite", choices=["engine", "e2e", "transport", "all"], default="all")
    p.add_argument("--plot", metavar="FILE.png", help="plot the end-to-end latencies")
    p.add_argument("--json", action="store_true", help="JSON instead of tables")
    p.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    p.set_defaults(func=bench)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
