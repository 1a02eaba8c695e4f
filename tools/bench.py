"""Run the benchmark suites and print their tables (or one JSON object): ``rte bench``.

    python -m tools.bench [--suite engine|e2e|transport|scale|realtime|state|all] [--windows 5]
                          [--json] [--quick] [--plot FILE.png]

Each suite prints a line to stderr per size or peer as it goes; at the end
come the tables, or with ``--json`` one object holding every suite that ran
(under ``engine``, ``e2e``, ``inputs``, ``transport``, ``scale``, ``realtime``, ``video``,
``ray``, ``state``; ``inputs`` runs with the e2e suite: a large frame in per step;
``realtime`` and ``state`` measure in time, not in windows: see
:mod:`tools.bench_realtime` and :mod:`tools.bench_state`; ``video``, ``ray`` and
``state`` run only when named), which ``python -m
tools.readme_tables`` turns into the tables of docs/benchmarks.md. ``--quick`` is a smoke
run (2 windows, few rounds; under a minute). Run from a checkout
(``tools`` is never installed); ``rte bench`` finds the checkout and runs this.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from typing import Any

from tools import (
    bench_e2e,
    bench_engine,
    bench_inputs,
    bench_ray,
    bench_realtime,
    bench_scale,
    bench_state,
    bench_transport,
    bench_video,
)
from tools.report import (
    DEFAULT_WINDOWS,
    check_plotting,
    machine,
    plot_latency,
    print_json,
    print_tables,
)

SIZES = [1, 8, 64]
SUITES = ["engine", "e2e", "transport", "scale", "realtime", "video", "ray", "state", "all"]
QUICK_WINDOWS = 2


def _windows(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"at least 1 window, got {n}")
    return n


def run(suite: str, n_windows: int, quick: bool) -> dict[str, Any]:
    """Every suite named by ``suite`` ("all": every one), keyed by its name."""
    results: dict[str, Any] = {}
    if suite in ("engine", "all"):
        results["engine"] = bench_engine.run(SIZES, 300 if quick else 2000, n_windows)
    if suite in ("e2e", "all"):
        results["e2e"] = bench_e2e.run(
            SIZES,
            40 if quick else 200,
            n_windows=n_windows,
            paced_rounds=4 if quick else 12,
            rate_seconds=0.2 if quick else 0.5,
            paced_seconds=0.2 if quick else 0.5,
        )
        results["inputs"] = bench_inputs.run(20 if quick else 100, n_windows)
    if suite in ("transport", "all"):
        results["transport"] = bench_transport.run(quick, n_windows)
    if suite in ("scale", "all"):
        results["scale"] = bench_scale.run([1, 2], n_windows=n_windows, rounds=10 if quick else 50)
    if suite in ("realtime", "all"):
        results["realtime"] = bench_realtime.run(
            bench_realtime.QUICK if quick else bench_realtime.Plan()
        )
    if suite == "video":  # not in "all": it needs Chromium (tools/install_browser.sh)
        results["video"] = bench_video.run(bench_video.QUICK if quick else bench_video.Plan())
    if suite == "ray":  # not in "all": the ray extra, a 3-node local cluster
        results["ray"] = bench_ray.run(n_windows, 10 if quick else 50)
    if suite == "state":  # not in "all": real daemons at 30 Hz for about a minute
        results["state"] = bench_state.run(bench_state.QUICK if quick else bench_state.Plan())
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--suite", choices=SUITES, default="all")
    parser.add_argument(
        "--windows",
        type=_windows,
        help=f"repeat each measurement this many times (default {DEFAULT_WINDOWS}; "
        f"{QUICK_WINDOWS} with --quick)",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="plot the end-to-end latencies")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = parser.parse_args(argv)
    if args.plot and args.suite not in ("e2e", "all"):
        parser.error("--plot plots the e2e suite: use --suite e2e or all")
    if args.plot:
        check_plotting()  # before the suite runs, not after
    n_windows = args.windows or (QUICK_WINDOWS if args.quick else DEFAULT_WINDOWS)
    began = time.monotonic()
    results = run(args.suite, n_windows, args.quick)
    seconds = time.monotonic() - began
    print(f"bench: done in {seconds:.0f} s", file=sys.stderr, flush=True)
    if args.plot:
        plot_latency(results["e2e"], args.plot)
    if args.json:
        print_json(
            {
                "machine": machine(),
                "date": datetime.date.today().isoformat(),
                "windows": n_windows,
                "quick": args.quick,
                "seconds": round(seconds, 1),
                **results,
            }
        )
        return
    tables = {"engine": bench_engine.TABLES, "e2e": bench_e2e.TABLES, "inputs": bench_inputs.TABLES}
    tables["transport"] = bench_transport.TABLES
    tables["scale"] = bench_scale.TABLES
    tables["realtime"] = bench_realtime.TABLES
    tables["video"] = bench_video.TABLES
    tables["ray"] = bench_ray.TABLES
    tables["state"] = bench_state.TABLES
    for name, result in results.items():
        print_tables(result, tables[name])


if __name__ == "__main__":
    main()
