"""Scale: 1 vs N daemons on one box through the pool client, as ratios to one daemon.

    python -m tools.bench_scale [--daemons 1 2] [--sessions 4] [--windows 5] [--json]

For each model (``null``: zero-cost stages, so the engine and transport are
all there is; ``reference``: a NumPy model with real work per row) and each
daemon count N, ``rte serve`` runs N times (``--max-sessions S`` each) and a
:class:`rte.client.PoolClient` attaches S sessions per daemon (admission by
free rows spreads them evenly), then per window:

* ``chunks_per_s``: step batches taken and released as fast as they come for
  ``--seconds``, from every daemon at once (the pool waits on all their FIFOs);
* ``p50_us`` / ``p99_us`` (null only: its chunks carry the last ``tag``): an
  action to a session, round robin over the sessions, until a chunk of it
  carries the tag.

``*_x_one`` is each figure over the one-daemon figure of the same model in the
same run (median over windows, half-range spread as in ``tools.report``).
Weak scaling: N daemons serve N times the sessions. On a box with a GPU per
daemon each daemon brings its own device; on a CPU-only box they share the
cores, so expect about 1x at best where one daemon already fills them.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time
from collections.abc import Iterator
from typing import Any

from rte.client import PoolClient, connect_pool
from rte.models.null import tag_of
from tools import report
from tools.bench_e2e import TIMEOUT_S, Daemon

MODELS = ("null", "reference")
COLUMNS = ["model", "daemons", "sessions", "chunks_per_s", "chunks_x_one", "p50_us"]
COLUMNS += ["p50_x_one", "p99_us", "p99_x_one"]
TABLES: list[report.TableSpec] = [
    ("Scale: N daemons through one pool client (weak scaling)", "rows", {}, COLUMNS)
]


def _drain(client: PoolClient, seconds: float) -> int:
    count, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        batch = client.poll_batch(timeout=0.1)
        if batch is not None:
            count += len(batch)
            batch.release()
    return count


def _round(client: PoolClient, session: str, tag: int) -> int:
    """Act, then take batches until a chunk of ``session`` carries ``tag``: ns."""
    sent = time.monotonic_ns()
    client.act(session, {"tag": tag})
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        batch = client.poll_batch(timeout=0.1)
        if batch is None:
            continue
        with batch:
            for i, name in enumerate(batch.sessions):
                if name == session and tag_of(batch.latents[i]) == tag:
                    return time.monotonic_ns() - sent
    raise RuntimeError(f"no chunk of {session} carried tag {tag} in {TIMEOUT_S}s")


def _window(
    client: PoolClient, model: str, rounds: int, seconds: float, tags: Iterator[int]
) -> dict[str, float]:
    figures = {"chunks_per_s": _drain(client, seconds) / seconds}
    if model == "null":
        names = sorted(client.sessions)
        took = [_round(client, names[i % len(names)], next(tags)) for i in range(rounds)]
        figures |= {k: v for k, v in report.percentiles_us(took).items() if k != "mean_us"}
    return figures


def measure(
    model: str, daemons: int, sessions: int, n_windows: int, rounds: int, seconds: float,
    progress: report.Progress, prefix: str = "bench",
) -> dict[str, Any]:  # fmt: skip
    started = [Daemon(sessions, prefix=prefix, model=model) for _ in range(daemons)]
    try:
        for d in started:
            d.connect().close()  # each is up
        client = connect_pool([d.name for d in started], timeout=60)
        with client:
            for i in range(daemons * sessions):
                client.attach(f"s{i}")
            tags = itertools.count(1)
            window = functools.partial(_window, client, model, rounds, seconds, tags)
            what = f"model={model} daemons={daemons}"
            summary = progress.measure(what, window, n_windows, "chunks_per_s", "chunks/s")
    finally:
        for d in started:
            d.close()
    return {"model": model, "daemons": daemons, "sessions": daemons * sessions, **summary}


def run(
    counts: list[int], sessions: int = 4, n_windows: int = report.DEFAULT_WINDOWS,
    rounds: int = 50, seconds: float = 0.5, prefix: str = "bench",
) -> dict[str, Any]:  # fmt: skip
    progress = report.Progress("scale", len(MODELS) * len(counts))
    rows = []
    for model in MODELS:
        one: dict[str, Any] | None = None
        for n in counts:
            row = measure(model, n, sessions, n_windows, rounds, seconds, progress, prefix)
            one = one or row
            for key in ("chunks_per_s", "p50_us", "p99_us"):
                if row.get(key) and one.get(key):
                    short = "chunks" if key == "chunks_per_s" else key.removesuffix("_us")
                    row[f"{short}_x_one"] = row[key] / one[key]
            rows.append(row)
    return {"bench": "scale", "machine": report.machine(), "windows": n_windows, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemons", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sessions", type=int, default=4, help="sessions per daemon")
    parser.add_argument("--windows", type=int, default=report.DEFAULT_WINDOWS)
    parser.add_argument("--rounds", type=int, default=50, help="latency rounds per window")
    parser.add_argument("--seconds", type=float, default=0.5, help="chunks/s window")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.daemons, args.sessions, args.windows, args.rounds, args.seconds)
    if args.json:
        report.print_json(result)
    else:
        report.print_tables(result, TABLES)


if __name__ == "__main__":
    main()
