"""Ray at the speed of the node: ``python -m tools.bench_ray`` (``rte bench --suite ray``).

A local Ray cluster of three nodes on this machine (:func:`rte.ray.local_cluster`),
a :class:`~rte.ray.hosting.DaemonHost` on each (``null`` model), and three clients,
one session each, flat out:

- ``direct``: a :class:`~rte.client.shm.ShmClient` of this node's daemon (the floor);
- ``ray-local``: a :class:`~rte.ray.RayClient` whose session is on this node's daemon
  (shared memory, in place);
- ``ray-remote``: one whose session is on another node's (its chunks pushed by the
  host; by default each waits for the caller's release, a round trip);
- ``ray-remote-w4``: the same, its session 4 chunks ahead of the caller beyond
  its credits (``RayClient(window=4)``, :mod:`rte.ray.window`): what reading
  ahead buys in chunks/s, and costs in latency.

Per client and window: chunks/s (``poll_batch``, released per batch) and the
latency from an action to the first chunk that shows it (p50, p99). Each window
measures the forms in a rotated order (direct, local, remote, remote-w4; then
local, remote, remote-w4, direct; ...), so none is always the first while the nodes settle;
a whole window of each form is run first and not counted (the cluster's
processes are still starting), and each form's window opens with a warm-up
that is not counted either (its session attached, streaming and acting for
``warmup`` s). The table holds the medians
over windows; the ratios are to ``direct`` measured in the same run: the
issue's targets are ray-local >= 0.8x the chunks/s at <= 1.5x the p50,
ray-remote p50 <= 2 ms on loopback and >= 0.3x the chunks/s.

A second table is Ray's own floor in the same run, what any remote session pays
before rte does anything (:func:`ray_floor`, an idle actor on the remote
session's node): an actor call's round trip, and a streaming generator's items
(each a timestamp, taken as the caller iterates: items/s and each item's
latency from its yield). An action's round trip through a remote host is at
least one call's way there and one item's way back.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from tools import report
from tools.bench_e2e import flat_out, tag_round

FORMS = ["direct", "ray-local", "ray-remote", "ray-remote-w4"]
AHEAD = 4  # ray-remote-w4's window
COLUMNS = ["client", "chunks_per_s", "x_direct", "p50_us", "p99_us", "x_direct_p50"]
FLOOR = ["call_p50_us", "call_p99_us", "stream_items_per_s", "item_p50_us", "item_p99_us"]
TABLES: list[report.TableSpec] = [
    ("Ray at the speed of the node (null model, 1 session each, flat out)", "rows", {}, COLUMNS),
    ("Ray's own floor: an idle actor on the remote node", "floor", {}, FLOOR),
]


class Floor:
    """An idle actor: a call that does nothing, and a stream of timestamps."""

    def ping(self) -> int:
        return 0

    def node(self) -> str:
        """The node it runs on."""
        return str(importlib.import_module("ray").get_runtime_context().get_node_id())

    async def stamps(self, n: int) -> AsyncIterator[int]:
        for _ in range(n):
            yield time.monotonic_ns()


def floor_actor(node: str) -> Any:
    """A :class:`Floor` actor on the node whose id is ``node`` (and nowhere else)."""
    ray = importlib.import_module("ray")
    strategies = importlib.import_module("ray.util.scheduling_strategies")
    where = strategies.NodeAffinitySchedulingStrategy(node, soft=False)
    return ray.remote(num_cpus=0)(Floor).options(scheduling_strategy=where).remote()


def ray_floor(actor: Any, calls: int = 200, items: int = 500) -> dict[str, float]:
    """One window of Ray's floor through ``actor`` (a :class:`Floor`)."""
    ray = importlib.import_module("ray")
    for _ in range(max(1, calls // 10)):  # (the first calls set up the connection)
        ray.get(actor.ping.remote())
    rtt: list[int] = []
    for _ in range(calls):
        began = time.monotonic_ns()
        ray.get(actor.ping.remote())
        rtt.append(time.monotonic_ns() - began)
    latency: list[int] = []
    start = time.monotonic()
    for ref in actor.stamps.remote(items):
        latency.append(time.monotonic_ns() - ray.get(ref))
    rate = len(latency) / (time.monotonic() - start)
    call, item = report.percentiles_us(rtt), report.percentiles_us(latency)
    return {
        "call_p50_us": call["p50_us"],
        "call_p99_us": call["p99_us"],
        "stream_items_per_s": rate,
        "item_p50_us": item["p50_us"],
        "item_p99_us": item["p99_us"],
    }


def _window(
    client: Any, session: str, plan: tuple[int, float, float], tags: Iterator[int]
) -> dict[str, float]:
    """One form's window: attached, warmed up (not counted), measured, detached."""
    rounds, seconds, warmup = plan
    client.attach(session)
    try:
        flat_out(client, warmup / 2)
        for _ in range(max(1, rounds // 5)):
            tag_round(client, session, next(tags))
        flat_out(client, warmup / 2)
        count = flat_out(client, seconds)
        p = report.percentiles_us([tag_round(client, session, next(tags)) for _ in range(rounds)])
    finally:
        client.detach(session)
    return {"chunks_per_s": count / seconds, "p50_us": p["p50_us"], "p99_us": p["p99_us"]}


def rotated(forms: list[str], window: int) -> list[str]:
    """The order of window ``window``: ``forms`` rotated by one more each window."""
    k = window % len(forms)
    return forms[k:] + forms[:k]


def run(
    n_windows: int = 3,
    rounds: int = 50,
    seconds: float = 1.0,
    prefix: str = "bench",
    warmup: float = 0.5,
) -> dict[str, Any]:
    from rte.client import ShmClient  # noqa: PLC0415
    from rte.ray import RayClient, Router, local_cluster, start_hosts  # noqa: PLC0415 (the extra)

    ray = importlib.import_module("ray")  # after rte.ray: it sets Ray's environment first

    progress = report.Progress("ray", n_windows)
    per_form: dict[str, list[dict[str, float]]] = {form: [] for form in FORMS}
    with local_cluster([{"rte_gpu": 1}] * 3):
        args = ["--model", "null", "--max-sessions", "2"]
        hosts, _ = start_hosts(args, 3, name=f"{prefix}-ray-{uuid.uuid4().hex[:6]}")
        here = ray.get_runtime_context().get_node_id()
        places = ray.get([h.where.remote() for h in hosts])
        local = next(i for i, (_, node) in enumerate(places) if node == here)
        remote = next(i for i, (_, node) in enumerate(places) if node != here)
        router_class: Any = ray.remote(num_cpus=0)(Router)
        clients: dict[str, Any] = {"direct": ShmClient(places[local][0], timeout=30)}
        for label, index in (("ray-local", local), ("ray-remote", remote)):
            clients[label] = RayClient(router_class.remote([hosts[index]]), [hosts[index]])
        there = [hosts[remote]]
        clients["ray-remote-w4"] = RayClient(router_class.remote(there), there, window=AHEAD)
        tags = itertools.count(1)
        idle = floor_actor(places[remote][1])  # (Ray's floor, beside the forms)
        floors: list[dict[str, float]] = []
        try:
            for form in FORMS:  # the settling window: not counted
                _window(clients[form], form, (rounds, seconds, warmup), tags)
            for w in range(n_windows):
                began = time.monotonic()
                for form in rotated(FORMS, w):
                    got = _window(clients[form], form, (rounds, seconds, warmup), tags)
                    per_form[form].append(got)
                floors.append(ray_floor(idle, 4 * rounds, 10 * rounds))
                line = ", ".join(
                    f"{f} {per_form[f][-1]['chunks_per_s']:,.0f}/s p50 "
                    f"{per_form[f][-1]['p50_us']:,.0f} us"
                    for f in FORMS
                )
                line += f"; Ray's call {floors[-1]['call_p50_us']:,.0f} us"
                progress.done += 1
                report.progress(
                    "ray",
                    progress.done,
                    n_windows,
                    f"order {rotated(FORMS, w)}: {line} ({time.monotonic() - began:.1f} s)",
                )
        finally:
            for client in clients.values():
                client.close()
            ray.get([host.stop.remote() for host in hosts], timeout=120)
    rows: list[dict[str, Any]] = [
        {"client": form, **report.summarize(per_form[form])} for form in FORMS
    ]
    floor = rows[0]  # (direct, this run's)
    for row in rows:
        row["x_direct"] = row["chunks_per_s"] / floor["chunks_per_s"]
        row["x_direct_p50"] = row["p50_us"] / floor["p50_us"]
    return {
        "bench": "ray",
        "machine": report.machine(),
        "windows": n_windows,
        "warmup_s": warmup,
        "rows": rows,
        "floor": [report.summarize(floors)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=0.5, help="per form and window, uncounted")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.windows, args.rounds, args.seconds, warmup=args.warmup)
    report.emit(result, TABLES, args.json)


if __name__ == "__main__":
    main()
