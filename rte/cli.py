"""The ``rte`` command.

rte demo        stream a few sessions of the reference model and show rates
rte bench       the engine scheduling-overhead benchmark (see tools/)
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from rte.composed import ComposedEngine
from rte.contract import Action
from rte.models import load_model


def demo(args: argparse.Namespace) -> int:
    """Stream ``--sessions`` sessions in process for ``--seconds`` and print their rates."""
    model = load_model(args.model, max_sessions=args.sessions)
    engine = ComposedEngine(model)
    manifest = engine.manifest()
    print(
        f"rte demo: model {manifest.model}, {args.sessions} sessions, chunk "
        f"{manifest.latent_shape} {manifest.latent_dtype}, pipeline depth "
        f"{manifest.pipeline_depth_chunks}, lanes {engine.lanes.kind}",
        file=sys.stderr,
    )
    names = [f"session-{i}" for i in range(args.sessions)]
    for i, name in enumerate(names):
        engine.attach(name, {"prompt": f"world {i}", "move": (0, 0)})
    latencies: dict[str, list[int]] = {n: [] for n in names}
    start = time.monotonic()
    next_report = start + 1.0
    step = 0
    while (now := time.monotonic()) - start < args.seconds:
        actions = {n: Action({"move": (step % 3 - 1, (step // 7) % 3 - 1)}) for n in names}
        if step == 20:
            actions[names[0]] = Action({"prompt": "a new world"})  # one heavy change
        for result in engine.step(names, actions):
            if result.has_chunk:
                latencies[result.session].append(result.timing.latency_ns)
        step += 1
        if now >= next_report:
            total = sum(len(v) for v in latencies.values())
            print(f"  {now - start:4.1f}s  {total / (now - start):8.1f} chunks/s", file=sys.stderr)
            next_report += 1.0
    elapsed = time.monotonic() - start
    engine.close()
    print(f"{'session':<12}{'chunks':>8}{'chunks/s':>10}{'lat p50 ms':>12}{'lat p99 ms':>12}")
    for name in names:
        lat = np.asarray(latencies[name], dtype=np.float64) / 1e6
        p50, p99 = np.percentile(lat, [50, 99]) if lat.size else (float("nan"),) * 2
        print(f"{name:<12}{lat.size:>8}{lat.size / elapsed:>10.1f}{p50:>12.3f}{p99:>12.3f}")
    return 0


def bench(args: argparse.Namespace) -> int:
    """Run the benchmark suites in ``tools/`` (each prints its own table or JSON)."""
    from tools import bench_engine, bench_transport  # noqa: PLC0415 (only this command)

    flags = ["--json"] if args.json else []
    if args.suite in ("engine", "all"):
        bench_engine.main(flags + (["--steps", "300"] if args.quick else []))
    if args.suite in ("transport", "all"):
        bench_transport.main(flags + (["--quick"] if args.quick else []))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rte", description="realtime inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="stream sessions of a model and print their rates")
    p.add_argument("--model", default="reference", help="short name or module:factory")
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0)
    p.set_defaults(func=demo)
    p = sub.add_parser("bench", help="run the benchmarks and print their tables")
    p.add_argument("--suite", choices=["engine", "transport", "all"], default="all")
    p.add_argument("--json", action="store_true", help="JSON instead of tables")
    p.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    p.set_defaults(func=bench)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
