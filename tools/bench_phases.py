"""Where a chunk's time goes through a daemon, phase by phase (issue 27's profile).

Every STEP batch carries its chunks' stamps (:class:`~rte.contract.Timing`):
``generated_ns`` (the step that generated it began), ``emitted_ns`` (the step
that emits it returned it), ``pushed_ns`` (the daemon pushed its record) and
``taken_ns`` (the client popped it); the client adds ``held`` (its
``poll_batch`` returned). Two rows, through ``rte serve --model null``:

* ``flat act``: flat out, one session. Each round sends an action (a new
  ``tag``) and takes batches until a chunk carries it. The phases, from the
  action sent: until the step that applied it began (``act_to_generated``: the
  chunks already made or in flight come first, each waiting for the client's
  release of an earlier one, its credit), the pipeline's turn until that chunk
  is emitted, then the daemon's delivery (``emitted_to_pushed``), the ring
  (``pushed_to_taken``) and the client's receive (``taken_to_held``);
  ``batches`` how many batches each round took.
* ``paced``: 60 Hz, ``--sessions`` sessions, every batch: emitted to pushed,
  pushed to taken, taken to held (``emitted_to_held`` is the README's
  "emitted to held"). ``--pace-hz 60 500 2000`` adds a row per rate: the same
  turn with a shorter gap between ticks, so the rows show how much of the
  60 Hz figure is the gap itself (a path run once every 16.7 ms finds its
  caches cold on a shared host) and how much the path.

Figures are p50 in µs over the rounds (or batches) of a window, medians over
``--windows`` windows. A breakdown, not a race: run it beside
``python -m tools.bench_e2e`` (whose ratios are the targets).

    python -m tools.bench_phases [--rounds 300] [--seconds 3] [--sessions 1]
                                 [--pace-hz 60 [HZ ...]] [--windows 3] [--json]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from rte.models.null import tag_of
from tools import report
from tools.bench_e2e import TIMEOUT_S, Daemon

FLAT = ["act_to_generated", "generated_to_emitted", "emitted_to_pushed"]
FLAT += ["pushed_to_taken", "taken_to_held", "act_to_held", "batches"]
PACED = ["emitted_to_pushed", "pushed_to_taken", "taken_to_held", "emitted_to_held"]
TABLES: list[report.TableSpec] = [
    ("An action's round trip, phase by phase (flat, 1 session, p50 µs)", "rows",
     {"mode": "flat act"}, ["mode", *FLAT]),
    ("A paced chunk's delivery, phase by phase (p50 µs)", "rows",
     {"mode": "paced"}, ["mode", "sessions", "pace_hz", *PACED]),
]  # fmt: skip


def _p50(rows: list[tuple[int, ...]], k: int, scale: float = 1e3) -> float:
    return statistics.median(r[k] for r in rows) / scale


def flat_act(rounds: int) -> dict[str, float]:
    """One window of ``rounds`` actions to one session of a flat daemon."""
    daemon = Daemon(1)
    client = daemon.connect()
    try:
        client.attach("s")
        for _ in range(8):  # the pipeline full, the first chunks out of the way
            batch = client.poll_batch(timeout=TIMEOUT_S)
            if batch is not None:
                batch.release()
        rows: list[tuple[int, ...]] = []
        for r in range(rounds):
            tag, taken = 1000 + r, 0
            sent = time.monotonic_ns()
            client.act("s", {"tag": tag})
            while len(rows) <= r:
                batch = client.poll_batch(timeout=TIMEOUT_S)
                if batch is None:
                    raise RuntimeError(f"no chunk from the daemon in {TIMEOUT_S}s")
                taken += 1
                with batch:
                    if tag_of(batch.latents[0]) != tag:
                        continue
                    held = time.monotonic_ns()
                    gen = int(batch.generated_ns[0])
                    stamps = (gen, batch.emitted_ns, batch.pushed_ns, batch.taken_ns, held)
                    phases = [b - a for a, b in zip((sent, *stamps[:-1]), stamps, strict=True)]
                    rows.append((*phases, held - sent, taken))
        figures = {name: _p50(rows, k) for k, name in enumerate(FLAT[:-1])}
        return figures | {"batches": _p50(rows, len(FLAT) - 1, 1.0)}
    finally:
        client.close()
        daemon.close()


def paced(sessions: int, seconds: float, pace_hz: float = 60.0) -> dict[str, float]:
    """One window of every batch of ``sessions`` sessions of a daemon paced at ``pace_hz``."""
    daemon = Daemon(sessions, pace_hz=pace_hz, prefix="phases")
    client = daemon.connect()
    try:
        for i in range(sessions):
            client.attach(f"s{i}")
        rows: list[tuple[int, ...]] = []
        warm_until = time.monotonic() + 0.5
        end = warm_until + seconds
        while (now := time.monotonic()) < end:
            batch = client.poll_batch(timeout=TIMEOUT_S)
            if batch is None:
                raise RuntimeError(f"no chunk from the daemon in {TIMEOUT_S}s")
            held = time.monotonic_ns()
            stamps = (batch.emitted_ns, batch.pushed_ns, batch.taken_ns, held)
            batch.release()
            if now >= warm_until:
                phases = [b - a for a, b in itertools.pairwise(stamps)]
                rows.append((*phases, held - stamps[0]))
        return {name: _p50(rows, k) for k, name in enumerate(PACED)}
    finally:
        client.close()
        daemon.close()


def run(
    rounds: int,
    seconds: float,
    sessions: int,
    n_windows: int,
    pace_hz: Sequence[float] = (60.0,),
) -> dict[str, Any]:
    """The flat row and a paced row per rate, each the median of ``n_windows`` windows."""
    rows: list[dict[str, Any]] = []
    plan: list[tuple[str, float, Callable[[], dict[str, float]]]] = [
        ("flat act", 0.0, lambda: flat_act(rounds))
    ]
    plan += [("paced", hz, functools.partial(paced, sessions, seconds, hz)) for hz in pace_hz]
    for mode, hz, measure in plan:
        row = report.summarize(report.windows(measure, n_windows))
        total = row.get("act_to_held", row.get("emitted_to_held")) or 0.0
        label = f"{mode} {hz:g} Hz" if hz else mode
        report.progress("phases", len(rows) + 1, len(plan), f"{label}: {total:,.1f} µs p50 in all")
        first = {"mode": mode, "sessions": sessions if hz else 1}
        rows.append(first | ({"pace_hz": hz} if hz else {}) | row)
    return {"machine": report.machine(), "windows": n_windows, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300, help="actions per flat window")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per paced window")
    parser.add_argument("--sessions", type=int, default=1, help="sessions of the paced rows")
    parser.add_argument(
        "--pace-hz", type=float, nargs="+", default=[60.0], help="a paced row per rate"
    )
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.rounds, args.seconds, args.sessions, args.windows, args.pace_hz)
    report.emit(result, TABLES, args.json)


if __name__ == "__main__":
    main()
