"""Ray at the speed of the node: ``python -m tools.bench_ray`` (``rte bench --suite ray``).

A local Ray cluster of three nodes on this machine (:func:`rte.ray.local_cluster`),
a :class:`~rte.ray.hosting.DaemonHost` on each (``null`` model), and three clients
measured one after the other on one session each, flat out:

- ``direct``: a :class:`~rte.client.shm.ShmClient` of this node's daemon (the floor);
- ``ray-local``: a :class:`~rte.ray.RayClient` whose session is on this node's daemon
  (shared memory, in place);
- ``ray-remote``: one whose session is on another node's (its chunks pushed by the host).

Per client: chunks/s (``poll_batch``, released per batch) and the latency from
an action to the first chunk that shows it (p50, p99). The ratios to ``direct``
are the issue's targets: ray-local >= 0.8x the chunks/s at <= 1.5x the p50;
ray-remote p50 <= 2 ms on loopback and >= 0.3x the chunks/s.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

from rte.models.null import tag_of
from tools import report

TIMEOUT_S = 10.0
COLUMNS = ["client", "chunks_per_s", "x_direct", "p50_us", "p99_us", "x_direct_p50"]
TABLES: list[report.TableSpec] = [
    ("Ray at the speed of the node (null model, 1 session each, flat out)", "rows", {}, COLUMNS)
]


def _window(
    client: Any, session: str, rounds: int, seconds: float, tags: Iterator[int]
) -> dict[str, float]:
    """Chunks/s of ``session`` flat out, then ``rounds`` actions to the chunk showing each."""
    count, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        batch = client.poll_batch(timeout=0.1)
        if batch is not None:
            count += len(batch)
            batch.release()
    took = []
    for _ in range(rounds):
        tag, sent = next(tags), time.monotonic_ns()
        client.act(session, {"tag": tag})
        while True:
            batch = client.poll_batch(timeout=0.1)
            if batch is not None:
                with batch:
                    rows = [i for i, s in enumerate(batch.sessions) if s == session]
                    if any(tag_of(batch.latents[i]) == tag for i in rows):
                        break
            if time.monotonic_ns() - sent > TIMEOUT_S * 1e9:
                raise RuntimeError(f"no chunk of {session} carried tag {tag}")
        took.append(time.monotonic_ns() - sent)
    p = report.percentiles_us(took)
    return {"chunks_per_s": count / seconds, "p50_us": p["p50_us"], "p99_us": p["p99_us"]}


def run(
    n_windows: int = 3, rounds: int = 50, seconds: float = 1.0, prefix: str = "bench"
) -> dict[str, Any]:
    from rte.client import ShmClient  # noqa: PLC0415
    from rte.ray import RayClient, Router, local_cluster, start_hosts  # noqa: PLC0415 (the extra)

    ray = importlib.import_module("ray")  # after rte.ray: it sets Ray's environment first

    progress = report.Progress("ray", 3)
    rows: list[dict[str, Any]] = []
    with local_cluster([{"rte_gpu": 1}] * 3):
        args = ["--model", "null", "--max-sessions", "2"]
        hosts, _ = start_hosts(args, 3, name=f"{prefix}-ray-{uuid.uuid4().hex[:6]}")
        here = ray.get_runtime_context().get_node_id()
        places = ray.get([h.where.remote() for h in hosts])
        local = next(i for i, (_, node) in enumerate(places) if node == here)
        remote = next(i for i, (_, node) in enumerate(places) if node != here)
        router_class: Any = ray.remote(num_cpus=0)(Router)
        clients: list[tuple[str, Any]] = [("direct", ShmClient(places[local][0], timeout=30))]
        for label, index in (("ray-local", local), ("ray-remote", remote)):
            clients.append((label, RayClient(router_class.remote([hosts[index]]), [hosts[index]])))
        tags = itertools.count(1)
        try:
            for label, client in clients:
                client.attach("s")
                window = lambda c=client: _window(c, "s", rounds, seconds, tags)  # noqa: E731
                summary = progress.measure(label, window, n_windows, "chunks_per_s", "chunks/s")
                client.detach("s")
                rows.append({"client": label, **summary})
        finally:
            for _, client in clients:
                client.close()
            ray.get([host.stop.remote() for host in hosts], timeout=120)
    floor = rows[0]
    for row in rows:
        row["x_direct"] = row["chunks_per_s"] / floor["chunks_per_s"]
        row["x_direct_p50"] = row["p50_us"] / floor["p50_us"]
    return {"bench": "ray", "machine": report.machine(), "windows": n_windows, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.windows, args.rounds, args.seconds)
    report.emit(result, TABLES, args.json)


if __name__ == "__main__":
    main()
