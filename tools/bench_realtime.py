"""Real time: what a paced daemon promises its sessions, measured as a user feels it.

    python -m tools.bench_realtime [--quick] [--json] [--pace-hz 30] [--callers 4]
    rte bench --suite realtime

The ``world`` model paced at ``--pace-hz`` (30), sessions played by interactive
callers in processes of their own (:mod:`tools.realtime_callers`: each takes
every batch as it comes and releases it at once, and moves each session every
quarter second). Four parts, each against its peer in the same run:

1. **ramp**: the real-time daemon filled a few sessions at a time until it
   refuses (what it admitted, and the capacity it published then), then levels
   from half to twice that, with real-time admission (``--admission
   realtime``, the default) and without (``--admission rows``): sessions
   admitted, per-session frames per second (min, median), chunks on time (min,
   median), the 99th percentile of the gap between a session's chunks, and rows
   per step. ``knee``: the largest level at which every session had at least
   99% of its chunks on time without admission.
2. **churn**: Poisson arrivals with exponential lifetimes offering 1.5x the
   capacity, both ways: sessions served and refused, each admitted session's
   chunks on time (p1, p50 over sessions), time to first chunk and input to
   photon (p50, p95/p99) and stalls per session-minute.
3. **overload**: 0.6x capacity in two priority classes (half each), then the
   model's cost doubled for a while, then restored: chunks on time and the
   share of its rate each class got, before, during and after.
4. **process per session**: the same sessions as one daemon each
   (``--max-sessions 1``, as the peers that serve one session per runtime do)
   against one daemon with all of them: sessions kept in real time, memory.

**On time.** A chunk's tick is one period after its session's previous chunk;
it is on time when it is emitted (``Chunk.timing.emitted_ns``) no later than
half a period after that tick, i.e. when its gap is at most 1.5 periods. A
session's *chunks on time* is the number of such chunks over the periods that
passed (so a session served at half its rate has 50% at best). A *stall* is a
gap of 3 periods or more. *Time to first chunk*: the attach sent to the first
chunk taken; *input to photon*: an act sent to the first chunk taken whose
``applied`` receipt is at least the act's ``seq``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from rte.ipc import inspect
from tools import report
from tools.bench_e2e import Daemon
from tools.realtime_callers import Callers, Track

ON_TIME = 1.5  # a gap of at most this many periods
STALL = 3.0
RAMP = ["admission", "published", "offered", "admitted", "fps_min", "fps_median", "on_time_min_pct"]
RAMP += ["on_time_median_pct", "gap_p99_ms", "rows_per_step"]
CHURN = ["admission", "offered_x", "served", "refused", "on_time_p1_pct", "on_time_p50_pct"]
CHURN += ["ttfc_p50_ms", "ttfc_p99_ms", "photon_p50_ms", "photon_p95_ms", "stalls_per_min"]
OVERLOAD = ["phase", "priority", "sessions", "on_time_pct", "rate_pct", "reduced_notices"]
PROCESSES = ["layout", "sessions", "in_real_time", "on_time_median_pct", "rss_mib"]
TABLES: list[report.TableSpec] = [
    ("Real time: ramp (world model)", "ramp", {}, RAMP),
    ("Real time: churn at 1.5x capacity", "churn", {}, CHURN),
    ("Real time: the model's cost doubled mid-run, two classes", "overload", {}, OVERLOAD),
    ("Real time: one daemon per session vs one daemon", "processes", {}, PROCESSES),
]


@dataclass(frozen=True)
class Plan:
    """How long and how big each part runs."""

    hz: float = 30.0
    callers: int = 4
    cost: float = 1.0  # the world model's cost multiplier (quick runs raise it)
    max_sessions: int = 256
    window_s: float = 3.0
    settle_s: float = 1.0
    levels: tuple[float, ...] = (0.5, 0.8, 0.9, 1.0, 1.1, 1.2, 1.5, 2.0)  # x capacity
    fill_step: int = 4  # sessions attached between pauses while filling
    fill_pause_s: float = 1.0  # (arrivals an operator sees: the model keeps up)
    churn_s: float = 60.0
    lifetime_s: float = 20.0
    overload_s: tuple[float, float, float] = (5.0, 10.0, 10.0)
    processes: int = 32
    act_every_s: float = 0.25


QUICK = Plan(
    callers=2,
    cost=6.0,
    max_sessions=16,
    window_s=1.0,
    settle_s=0.5,
    levels=(0.5, 1.0, 2.0),
    fill_step=1,
    fill_pause_s=0.3,
    churn_s=4.0,
    lifetime_s=2.0,
    overload_s=(1.0, 2.0, 2.0),
    processes=2,
)


# -- what a session saw ----------------------------------------------------------


def session_figures(emitted: Sequence[int], t0: int, t1: int, period: int) -> dict[str, float]:
    """One session's figures over ``[t0, t1)`` ns from its chunks' emission times."""
    e = np.asarray(emitted, dtype=np.int64)
    inside = e[(e >= t0) & (e < t1)]
    before = e[e < t0]
    times = np.concatenate([before[-1:], inside])  # the chunk before the window opens it
    if not len(times):
        return {"fps": 0.0, "on_time": 0.0, "gap_p99": 0.0, "stalls": 0.0}
    gaps = np.diff(times) / period
    # the periods that passed from the first chunk counted from to the window's end
    # (less half a period: a chunk due at the very end may land just past it)
    owed = max(1, int((t1 - times[0]) / period - 0.5))
    return {
        "fps": len(inside) / ((t1 - t0) / 1e9),
        "on_time": min(1.0, float(np.count_nonzero(gaps <= ON_TIME)) / owed),
        "gap_p99": float(np.percentile(gaps, 99)) * period / 1e6 if len(gaps) else 0.0,
        "stalls": float(np.count_nonzero(gaps >= STALL)),
    }


def _lifetime(track: Track, period: int) -> dict[str, float] | None:
    if len(track.emitted) < 2:
        return None
    first, last = track.emitted[0], track.emitted[-1]
    return session_figures(track.emitted, first + 1, last + period // 2 + 1, period) | {
        "minutes": (last - first) / 60e9,
        "ttfc": (track.first_taken_ns - track.attach_sent_ns) / 1e6,
    }


def _pct(values: Sequence[float], q: float, scale: float = 1.0) -> float:
    return float(np.percentile(values, q)) * scale if len(values) else float("nan")


# -- processes -------------------------------------------------------------------


@contextmanager
def _daemon(plan: Plan, admission: str, cost_file: str, sessions: int = 0) -> Iterator[Daemon]:
    rows = sessions or plan.max_sessions
    clients = max(plan.callers, 2)
    quota = 2 * rows + 4  # every session's two credits, whichever caller has it
    args = ["--pace-hz", str(plan.hz), "--admission", admission, "--max-clients", str(clients)]
    args += ["--quota", str(quota), "--slab-slots", str(quota * clients)]
    args += ["--model-setting", f"cost={plan.cost}", "--model-setting", f"cost_file={cost_file}"]
    daemon = Daemon(rows, model="world", prefix="rt", args=args)
    try:
        daemon.connect().close()  # up and serving
        yield daemon
    finally:
        daemon.close()


def _capacity(name: str) -> int | None:
    """What the daemon publishes as its real-time capacity (None: not known yet)."""
    capacity = inspect.snapshot(name)["realtime"]["capacity"]
    return None if capacity is None else int(capacity)


def _rows_per_step(name: str, before: dict[str, int]) -> tuple[float, dict[str, int]]:
    counters = inspect.snapshot(name)["counters"]
    steps = counters["steps"] - before.get("steps", 0)
    chunks = counters["chunks"] - before.get("chunks", 0)
    return (chunks / steps if steps else 0.0), counters


def _fill(plan: Plan, daemon: Daemon, callers: Callers) -> tuple[int, int]:
    """Attach sessions a few at a time (a pause between: the daemon sees turns of
    every size) until it refuses three in a row; then detach them all. What it
    admitted, and the capacity it published when it first said no."""
    admitted, refusals, published, k = 0, 0, -1, 0
    while refusals < 3 and admitted < plan.max_sessions:
        answers = callers.ask(k % plan.callers, "attach", [(f"f{k}", None, None)], 0.0)
        k += 1
        if answers[0][1]:
            admitted, refusals = admitted + 1, 0
            if admitted % plan.fill_step == 0:
                time.sleep(plan.fill_pause_s)
        else:
            refusals += 1
            if published < 0:
                published = _capacity(daemon.name) or 0
            time.sleep(plan.fill_pause_s)
    callers.everyone("detach_all")
    return admitted, published if published >= 0 else admitted


# -- the parts -------------------------------------------------------------------


def ramp(plan: Plan, cost_file: str) -> dict[str, Any]:
    """The real-time daemon filled until it says no (its capacity); then, both ways,
    levels around that capacity, each measured for a window."""
    rows: list[dict[str, Any]] = []
    capacity = published = 0
    for admission in ("realtime", "rows"):
        with _daemon(plan, admission, cost_file) as daemon, ExitStack() as stack:
            callers = Callers([daemon.name], plan.callers, plan.act_every_s)
            stack.callback(callers.close)
            if admission == "realtime":
                capacity, published = _fill(plan, daemon, callers)
            attached = 0
            levels = sorted({max(1, round(level * capacity)) for level in plan.levels})
            for offered in (n for n in levels if n <= plan.max_sessions):
                wanted = [(f"s{k}", None, None) for k in range(attached, offered)]
                for i in range(plan.callers):  # spread over the callers
                    callers.ask(i, "attach", wanted[i :: plan.callers], 0.0)
                attached = offered
                rows.append(
                    {"admission": admission, "offered": offered, **_window(plan, daemon, callers)}
                )
                report.progress("realtime", len(rows), 2 * len(levels), _line(rows[-1]))
    knee = max(
        (r["offered"] for r in rows if r["admission"] == "rows" and r["on_time_min_pct"] >= 99),
        default=0,
    )
    return {"rows": rows, "capacity": published, "admitted": capacity, "knee": knee}


def _window(plan: Plan, daemon: Daemon, callers: Callers) -> dict[str, Any]:
    """What every session felt over one window, after a settle."""
    time.sleep(plan.settle_s)
    _, before = _rows_per_step(daemon.name, {})
    t0 = time.monotonic_ns()
    time.sleep(plan.window_s)
    t1 = time.monotonic_ns()
    rows_per_step, _ = _rows_per_step(daemon.name, before)
    period = round(1e9 / plan.hz)
    tracks = callers.everyone("collect")
    figures = [session_figures(t.emitted, t0, t1, period) for t in tracks]
    fps = [f["fps"] for f in figures]
    on_time = [f["on_time"] * 100 for f in figures]
    published = _capacity(daemon.name)
    return {
        "published": -1 if published is None else published,
        "admitted": len(tracks),
        "fps_min": min(fps, default=0.0),
        "fps_median": _pct(fps, 50),
        "on_time_min_pct": min(on_time, default=0.0),
        "on_time_median_pct": _pct(on_time, 50),
        "gap_p99_ms": max((f["gap_p99"] for f in figures), default=0.0),
        "rows_per_step": rows_per_step,
    }


def _line(row: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


def churn(plan: Plan, cost_file: str, capacity: int) -> dict[str, Any]:
    rows = []
    period = round(1e9 / plan.hz)
    for admission in ("realtime", "rows"):
        with _daemon(plan, admission, cost_file) as daemon, ExitStack() as stack:
            callers = Callers([daemon.name], plan.callers, plan.act_every_s)
            stack.callback(callers.close)
            rate = 1.5 * capacity / plan.lifetime_s  # arrivals per second
            chance = random.Random(7)
            served: list[Track] = []
            refused = 0
            end = time.monotonic() + plan.churn_s
            k = 0
            while (now := time.monotonic()) < end:
                time.sleep(min(chance.expovariate(rate), max(0.0, end - now)))
                life = chance.expovariate(1 / plan.lifetime_s)
                answers = callers.ask(k % plan.callers, "attach", [(f"c{k}", None, life)], 0.0)
                refused += sum(1 for _, ok, _ in answers if not ok)
                k += 1
                if k % 20 == 0:
                    served += callers.everyone("finished")
            served += callers.everyone("detach_all")
            figures = [f for t in served if (f := _lifetime(t, period)) is not None]
            photon = [p / 1e6 for t in served for p in t.photon_ns]
            on_time = [f["on_time"] * 100 for f in figures]
            minutes = sum(f["minutes"] for f in figures)
            rows.append(
                {
                    "admission": admission,
                    "offered_x": 1.5,
                    "served": len(served),
                    "refused": refused,
                    "on_time_p1_pct": _pct(on_time, 1),
                    "on_time_p50_pct": _pct(on_time, 50),
                    "ttfc_p50_ms": _pct([f["ttfc"] for f in figures], 50),
                    "ttfc_p99_ms": _pct([f["ttfc"] for f in figures], 99),
                    "photon_p50_ms": _pct(photon, 50),
                    "photon_p95_ms": _pct(photon, 95),
                    "stalls_per_min": sum(f["stalls"] for f in figures) / minutes if minutes else 0,
                }
            )
            report.progress("realtime", len(rows), 2, "churn " + _line(rows[-1]))
    return {"rows": rows}


def overload(plan: Plan, cost_file: str, capacity: int, classes: tuple[int, int]) -> dict[str, Any]:
    rows = []
    period = round(1e9 / plan.hz)
    n = max(2, round(0.6 * capacity))  # doubled: 1.2x, and 0.75x with the low class at 1/4
    with _daemon(plan, "realtime", cost_file) as daemon, ExitStack() as stack:
        callers = Callers([daemon.name], plan.callers, plan.act_every_s)
        stack.callback(callers.close)
        wanted = [(f"o{k}", classes[k % 2], None) for k in range(n)]
        for i in range(plan.callers):
            callers.ask(i, "attach", wanted[i :: plan.callers], 0.0)
        time.sleep(plan.settle_s)
        marks = [time.monotonic_ns()]
        for phase, seconds in zip(("before", "during", "after"), plan.overload_s, strict=True):
            _write_cost(cost_file, 2.0 if phase == "during" else 1.0)
            time.sleep(seconds)
            marks.append(time.monotonic_ns())
        tracks = callers.everyone("collect")
        for p, phase in enumerate(("before", "during", "after")):
            for priority in classes:
                mine = [t for t in tracks if t.priority == priority]
                figures = [session_figures(t.emitted, marks[p], marks[p + 1], period) for t in mine]
                rows.append(
                    {
                        "phase": phase,
                        "priority": priority,
                        "sessions": len(mine),
                        "on_time_pct": _pct([f["on_time"] * 100 for f in figures], 50),
                        "rate_pct": _pct([f["fps"] / plan.hz * 100 for f in figures], 50),
                        "reduced_notices": sum(t.notices.count("REDUCED") for t in mine),
                    }
                )
        report.progress("realtime", 1, 1, f"overload: {len(tracks)} sessions")
    return {"rows": rows}


def _write_cost(path: str, factor: float) -> None:
    """The running daemon's model reads its cost multiplier from this file."""
    with open(path + ".new", "w") as f:
        f.write(f"{factor}\n")
    os.replace(path + ".new", path)


def processes(plan: Plan, cost_file: str, capacity: int) -> dict[str, Any]:
    """``n`` sessions as n daemons of one session each, then as one daemon."""
    rows = []
    period = round(1e9 / plan.hz)
    n = max(1, min(plan.processes, capacity))
    for layout in ("one daemon per session", "one daemon"):
        with ExitStack() as stack:
            count = n if layout != "one daemon" else 1
            one = dataclasses.replace(plan, callers=min(plan.callers, n))
            daemons = [
                stack.enter_context(_daemon(one, "rows", cost_file, 1 if count > 1 else n))
                for _ in range(count)
            ]
            callers = Callers([d.name for d in daemons], one.callers, plan.act_every_s)
            stack.callback(callers.close)
            wanted = [(f"p{k}", None, None) for k in range(n)]
            for i in range(one.callers):
                callers.ask(i, "attach", wanted[i :: one.callers], 0.0)
            time.sleep(plan.settle_s)
            t0 = time.monotonic_ns()
            time.sleep(plan.window_s)
            t1 = time.monotonic_ns()
            tracks = callers.everyone("collect")
            on_time = [session_figures(t.emitted, t0, t1, period)["on_time"] * 100 for t in tracks]
            rss = sum(psutil.Process(d.process.pid).memory_info().rss for d in daemons)
            rows.append(
                {
                    "layout": layout,
                    "sessions": n,
                    "in_real_time": sum(1 for v in on_time if v >= 99),
                    "on_time_median_pct": _pct(on_time, 50),
                    "rss_mib": rss / 2**20,
                }
            )
            report.progress("realtime", len(rows), 2, _line(rows[-1]))
    return {"rows": rows}


def run(plan: Plan) -> dict[str, Any]:
    """Every part; the knee and the capacity beside the ramp's rows."""
    with tempfile.TemporaryDirectory(prefix="rte-realtime-") as folder:
        cost_file = os.path.join(folder, "cost")
        _write_cost(cost_file, 1.0)
        ramped = ramp(plan, cost_file)
        capacity = max(1, ramped["admitted"])  # what the daemon let in: the load's unit
        return {
            "pace_hz": plan.hz,
            "windows": 1,
            "capacity": ramped["capacity"],
            "admitted": ramped["admitted"],
            "knee": ramped["knee"],
            "ramp": ramped["rows"],
            "churn": churn(plan, cost_file, capacity)["rows"],
            "overload": overload(plan, cost_file, capacity, (0, 2))["rows"],
            "processes": processes(plan, cost_file, capacity)["rows"],
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--pace-hz", type=float, default=Plan.hz)
    parser.add_argument("--callers", type=int, default=Plan.callers)
    parser.add_argument("--quick", action="store_true", help="a smoke run (under a minute)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan(hz=args.pace_hz, callers=args.callers)
    result = run(plan)
    if not args.json:
        print(
            f"capacity published {result['capacity']} (admitted {result['admitted']}), "
            f"knee measured {result['knee']}"
        )
    report.emit(result, TABLES, args.json)


if __name__ == "__main__":
    main()
