"""``rte bench``: run the benchmarks of a source checkout.

The benchmarks live in the checkout's ``tools/``, which is never installed:
this command finds the checkout this rte was installed from (``pip install
-e .``) and runs ``python -m tools.bench`` there, with the same options:
``--suite``, ``--windows``, ``--json``, ``--quick``, ``--plot``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import rte


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="run the benchmarks of this checkout (tools/) and print their tables",
        description="Run the benchmarks in the source checkout's tools/ (python -m tools.bench).",
    )
    p.add_argument(  # the checkout's tools/bench.py knows its suites and checks the name
        "--suite",
        default="all",
        help="engine, e2e, transport, scale, realtime, video (needs Chromium), ray "
        "(needs the ray extra), state (suspend, migrate, drain, checkpoint, replay) or all "
        "(default: every suite but video, ray and state)",
    )
    p.add_argument(
        "--windows", type=int, help="repeat each measurement this many times (default 5)"
    )
    p.add_argument("--plot", metavar="FILE.png", help="plot the end-to-end latencies")
    p.add_argument("--json", action="store_true", help="JSON instead of tables")
    p.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    p.set_defaults(func=run)


def checkout() -> Path | None:
    """The source checkout of this rte, if it has the benchmarks."""
    root = Path(rte.__file__).resolve().parents[1]
    return root if (root / "tools" / "bench.py").is_file() else None


def run(args: argparse.Namespace) -> int:
    root = checkout()
    if root is None:
        print(
            "rte bench: the benchmarks live in a source checkout's tools/, not in an installed "
            "rte; clone the repository, pip install -e . and run rte bench there",
            file=sys.stderr,
        )
        return 2
    command = [sys.executable, "-m", "tools.bench", "--suite", args.suite]
    command += ["--json"] * args.json + ["--quick"] * args.quick
    command += ["--plot", args.plot] if args.plot else []
    command += ["--windows", str(args.windows)] if args.windows else []
    return subprocess.call(command, cwd=root)
