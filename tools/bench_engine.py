"""Scheduling overhead of ComposedEngine.step, separate from stage compute.

The model is :class:`rte.models.NullModel` (zero-cost stages), so a step's time
is the engine's own. The peer, measured in the same run, is the floor: a bare
loop calling the same no-op stage functions on a prebuilt batch, with none of
the engine's bookkeeping. Ratios against it are the claim; absolute times drift
with the machine.

Each size is measured in ``--windows`` windows (default 5; each a fresh
engine, ``--steps`` timed steps, then the floor); every figure is the median
over windows with its spread (see ``tools.report``). ``overhead_x_floor`` is
taken per window (engine and floor of the same window); ``step_x_1_session``
is the ratio of the medians. ``realtime_us``: what a paced host's real-time
bookkeeping (pacer, cost model, overload governor, receipts) adds to a turn of
the serve loop over the same loop unpaced, and ``realtime_pct_of_step`` that
as a share of the engine's step. ``t_host_us``: the engine's own figure of
the host's share of a step (:meth:`ComposedEngine.host_share`, from a step's
publish to the next step's HOT launch) in the paced serve loop: what a device
would idle through per step unless the engine publishes fenced.

    python -m tools.bench_engine [--sessions 1 8 64] [--steps 2000] [--windows 5]
    python -m tools.bench_engine --json     # for scripts
"""

from __future__ import annotations

import argparse
import functools
import gc
import time
from typing import Any

import numpy as np

from rte import Batch, ComposedEngine
from rte.contract import Action
from rte.models import NullModel
from rte.protocol import latency
from rte.protocol.requests import Act, Attach
from rte.serve import ServeLoop
from tools.report import (
    DEFAULT_WINDOWS,
    Progress,
    TableSpec,
    emit,
    machine,
    percentiles_us,
)

COLUMNS = ["sessions", "step_p50_us", "step_p99_us", "per_session_us", "step_x_1_session"]
COLUMNS += ["floor_p50_us", "overhead_x_floor", "metrics_us", "metrics_pct_of_step"]
COLUMNS += ["realtime_us", "realtime_pct_of_step", "t_host_us"]
TABLES: list[TableSpec] = [
    ("ComposedEngine.step overhead (NullModel, pipelined, CPU lanes)", "rows", {}, COLUMNS)
]


def _engine_step_ns(sessions: int, steps: int) -> list[int]:
    engine = ComposedEngine(NullModel(max(sessions, 1)), lanes="cpu")
    names = [f"s{i}" for i in range(sessions)]
    for name in names:
        engine.attach(name)
    for _ in range(50):
        engine.step(names)  # warm up, fill the pipeline
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        engine.step(names)
        samples.append(time.perf_counter_ns() - t0)
    engine.close()
    return samples


def _floor_step_ns(sessions: int, steps: int) -> list[int]:
    rows = list(range(sessions))
    batch = Batch(rows, [f"s{i}" for i in rows], [0] * sessions, [{} for _ in rows])
    batch.out = [np.empty(16, np.uint8) for _ in rows]
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        NullModel.generate(batch)
        NullModel.decode(batch)
        samples.append(time.perf_counter_ns() - t0)
    return samples


def _serve_ns(sessions: int, steps: int, pace_hz: float) -> tuple[list[int], float]:
    """A :class:`rte.serve.ServeLoop` turn over the same engine: unpaced, its step
    alone (admission by rows: no real-time bookkeeping); paced, the turn a paced
    host makes (begin, step, end: the pacer's lateness, the cost model, the
    governor's filter and verdict, receipts for a session that acted). Also the
    engine's t_host over the run (µs a step)."""
    engine = ComposedEngine(NullModel(max(sessions, 1)), lanes="cpu")
    loop = ServeLoop(engine, pace_hz=pace_hz, admission="realtime" if pace_hz else "rows")
    names = [f"s{i}" for i in range(sessions)]
    for name in names:
        loop.handle(Attach(name))
    samples = []
    for k in range(50 + steps):
        if k % 10 == 0:  # a session acts now and then: receipts have work
            loop.handle(Act(names[k % sessions], Action({"tag": k}), seq=k + 1))
        t0 = time.perf_counter_ns()
        if pace_hz:
            loop.begin_turn()
            loop.step(names)
            loop.end_turn()
        else:
            loop.step(names)
        if k >= 50:
            samples.append(time.perf_counter_ns() - t0)
    t_host_us = engine.host_share().mean_ms * 1e3
    engine.close()
    return samples, t_host_us


def _metrics_ns(steps: int) -> list[int]:
    """What the daemon adds to a step to keep its step-time histogram for ``rte inspect
    --prometheus``: two clock reads and one add (bucket and sum) into shared words."""
    words = memoryview(bytearray(8 * (latency.BUCKETS + 1))).cast("Q")
    histogram = latency.Histogram(words[: latency.BUCKETS], words[latency.BUCKETS :])
    clock, samples = time.monotonic_ns, []
    for _ in range(steps):  # a hundred at a time: the timer's own cost is not the daemon's
        t0 = time.perf_counter_ns()
        for _ in range(100):
            started = clock()
            histogram.add(clock() - started)
        samples.append((time.perf_counter_ns() - t0) // 100)
    return samples


def _window(sessions: int, steps: int) -> dict[str, float]:
    """One window: a fresh engine's steps, then the floor's, at one size."""
    engine = percentiles_us(_engine_step_ns(sessions, steps))
    floor = percentiles_us(_floor_step_ns(sessions, steps))
    metrics = percentiles_us(_metrics_ns(steps))
    plain = percentiles_us(_serve_ns(sessions, steps, 0.0)[0])["p50_us"]
    paced_ns, t_host_us = _serve_ns(sessions, steps, 30.0)
    paced = percentiles_us(paced_ns)["p50_us"]
    return {
        "t_host_us": t_host_us,
        "realtime_us": paced - plain,
        "realtime_pct_of_step": 100 * (paced - plain) / max(engine["p50_us"], 1e-3),
        "metrics_us": metrics["p50_us"],
        "metrics_pct_of_step": 100 * metrics["p50_us"] / max(engine["p50_us"], 1e-3),
        "step_p50_us": engine["p50_us"],
        "step_p99_us": engine["p99_us"],
        "per_session_us": engine["p50_us"] / sessions,
        "floor_p50_us": floor["p50_us"],
        "overhead_x_floor": engine["p50_us"] / max(floor["p50_us"], 1e-3),
    }


def run(sizes: list[int], steps: int, n_windows: int = DEFAULT_WINDOWS) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    progress = Progress("engine", len(sizes))
    gc.disable()
    try:
        for n in sizes:
            window = functools.partial(_window, n, steps)
            summary = progress.measure(f"sessions={n}", window, n_windows, "step_p50_us", "µs")
            rows.append({"sessions": n, **summary})
    finally:
        gc.enable()
    for row in rows:
        row["step_x_1_session"] = row["step_p50_us"] / rows[0]["step_p50_us"]
    return {
        "bench": "engine_overhead",
        "machine": machine(),
        "steps": steps,
        "windows": n_windows,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per window")
    parser.add_argument("--windows", type=int, default=DEFAULT_WINDOWS)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    result = run(args.sessions, args.steps, args.windows)
    emit(result, TABLES, args.json)


if __name__ == "__main__":
    main()
