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

With ``--ray`` (the ray extra), two more rows: a local Ray cluster of two
nodes on this machine (every Ray process on 127.0.0.1), a daemon per node
(``null``), one :class:`rte.ray.RayClient` on the head node with S sessions on
each daemon: ``ray-local`` is the sessions on its own node's daemon (shared
memory, in place), ``ray-remote`` those on the other node's (chunks through
Ray's object store), measured as above from the same client at once.

``*_x_one`` is each figure over the one-daemon figure of the same model in the
same run (for the Ray rows: the one-daemon null row); medians over windows,
with the half-range spread of ``tools.report``.
Weak scaling: N daemons serve N times the sessions. On a box with a GPU per
daemon each daemon brings its own device; on a CPU-only box they share the
cores, so expect about 1x at best where one daemon already fills them.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

from rte.client import PoolClient, connect_pool
from rte.models.null import tag_of
from tools import report
from tools.bench_e2e import TIMEOUT_S, Daemon, flat_out, tag_round

MODELS = ("null", "reference")
COLUMNS = ["model", "daemons", "sessions", "chunks_per_s", "chunks_x_one", "p50_us"]
COLUMNS += ["p50_x_one", "p99_us", "p99_x_one"]
TABLES: list[report.TableSpec] = [
    ("Scale: N daemons through one pool client (weak scaling)", "rows", {}, COLUMNS)
]


def _window(
    client: PoolClient, model: str, rounds: int, seconds: float, tags: Iterator[int]
) -> dict[str, float]:
    figures = {"chunks_per_s": flat_out(client, seconds) / seconds}
    if model == "null":
        names = sorted(client.sessions)
        took = [tag_round(client, names[i % len(names)], next(tags)) for i in range(rounds)]
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


def _ray_window(client: Any, rounds: int, seconds: float, tags: Iterator[int]) -> dict[str, float]:
    """Chunks/s and latency per path (this node's daemon, the other node's)."""
    counts = {"shm": 0, "ray": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for frame in client.take(timeout=0.1):
            counts[frame.path] += 1
    figures = {f"{p}_chunks_per_s": n / seconds for p, n in counts.items()}
    for path in ("shm", "ray"):
        names = sorted(s for s in client.home if client.path(s) == path)
        took = []
        for i in range(rounds):
            session, tag = names[i % len(names)], next(tags)
            sent = time.monotonic_ns()
            client.act(session, {"tag": tag})
            while not any(
                f.session == session and tag_of(f.latent) == tag for f in client.take(0.1)
            ):
                if time.monotonic_ns() - sent > TIMEOUT_S * 1e9:
                    raise RuntimeError(f"no chunk of {session} carried tag {tag}")
            took.append(time.monotonic_ns() - sent)
        p = report.percentiles_us(took)
        figures |= {f"{path}_p50_us": p["p50_us"], f"{path}_p99_us": p["p99_us"]}
    return figures


def ray_rows(
    sessions: int, n_windows: int, rounds: int, seconds: float, progress: report.Progress,
    prefix: str = "bench",
) -> list[dict[str, Any]]:  # fmt: skip
    from rte.ray import RayClient, local_cluster, start_hosts  # noqa: PLC0415 (the ray extra)

    with local_cluster([{"rte_gpu": 1}] * 2):
        args = ["--model", "null", "--max-sessions", str(sessions)]
        hosts, router = start_hosts(args, 2, name=f"{prefix}-ray-{uuid.uuid4().hex[:6]}")
        client = RayClient(router, hosts)
        try:
            for i in range(2 * sessions):
                client.attach(f"s{i}")
            window = functools.partial(_ray_window, client, rounds, seconds, itertools.count(1))
            s = progress.measure("ray", window, n_windows, "shm_chunks_per_s", "chunks/s")
        finally:
            client.close()
            for host in hosts:
                host.stop.remote()
    return [
        {
            "model": f"ray-{label}",
            "daemons": 2,
            "sessions": sessions,
            "chunks_per_s": s[f"{path}_chunks_per_s"],
            "p50_us": s[f"{path}_p50_us"],
            "p99_us": s[f"{path}_p99_us"],
        }
        for label, path in (("local", "shm"), ("remote", "ray"))
    ]


def run(
    counts: list[int], sessions: int = 4, n_windows: int = report.DEFAULT_WINDOWS,
    rounds: int = 50, seconds: float = 0.5, prefix: str = "bench", with_ray: bool = False,
) -> dict[str, Any]:  # fmt: skip
    progress = report.Progress("scale", len(MODELS) * len(counts) + with_ray)
    rows: list[dict[str, Any]] = []
    ones: dict[str, dict[str, Any]] = {}
    for model in MODELS:
        for n in counts:
            rows.append(measure(model, n, sessions, n_windows, rounds, seconds, progress, prefix))
            ones.setdefault(model, rows[-1])
    if with_ray:
        rows += ray_rows(sessions, n_windows, rounds, seconds, progress, prefix)
    for row in rows:
        one = ones.get(row["model"], ones["null"])
        for key in ("chunks_per_s", "p50_us", "p99_us"):
            if row.get(key) and one.get(key):
                short = "chunks" if key == "chunks_per_s" else key.removesuffix("_us")
                row[f"{short}_x_one"] = row[key] / one[key]
    return {"bench": "scale", "machine": report.machine(), "windows": n_windows, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemons", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sessions", type=int, default=4, help="sessions per daemon")
    parser.add_argument("--windows", type=int, default=report.DEFAULT_WINDOWS)
    parser.add_argument("--rounds", type=int, default=50, help="latency rounds per window")
    parser.add_argument("--seconds", type=float, default=0.5, help="chunks/s window")
    parser.add_argument("--ray", action="store_true", help="also local vs remote through Ray")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(
        args.daemons, args.sessions, args.windows, args.rounds, args.seconds, with_ray=args.ray
    )
    report.emit(result, TABLES, args.json)


if __name__ == "__main__":
    main()
