"""rte on a real local Ray cluster (three nodes on this machine, every Ray process
on 127.0.0.1): a daemon per node placed by resources, sessions spread and sticky,
this node's daemon through shared memory and the others' through the object
store, a killed node's sessions reported and admitted again elsewhere, and
nothing left behind."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from daemon_harness import Deadline

from rte.client import EngineGone
from rte.models.null import tag_of
from rte.ray import RayClient, local_cluster, start_hosts  # first: it sets Ray's environment
from shm.names import objects, shm_name

ray = pytest.importorskip("ray", reason="the ray extra (in the dev extra): pip install -e '.[ray]'")

LOOPBACK = ("127.0.0.1", "::ffff:127.0.0.1", "::1")


def ray_processes(since: float) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "create_time"]):
        line = " ".join(p.info["cmdline"] or [])
        if p.info["create_time"] >= since - 1 and ("ray" in line or "raylet" in line):
            found.append(p)
    return found


def outside_addresses(processes: list[psutil.Process]) -> list[str]:
    """Any address a Ray process listens on or talks to that is not loopback."""
    bad = []
    for p in processes:
        try:
            for c in p.net_connections(kind="inet"):
                for end in (c.laddr, c.raddr):
                    if end and end.ip not in LOOPBACK:
                        bad.append(f"{p.name()} {end.ip}:{end.port}")
        except psutil.Error:
            continue
    return bad


@pytest.fixture
def cluster(shm_prefix: str) -> Iterator[tuple[Any, list[Any], Any, float]]:
    began = time.time()
    problems: list[str] = []
    with local_cluster([{"rte_gpu": 1}] * 3) as c:
        hosts, router = start_hosts(
            ["--model", "null", "--max-sessions", "2"], 3, name=f"{shm_prefix}h"
        )
        homes = [node for _, node in ray.get([h.where.remote() for h in hosts], timeout=60)]
        yield c, hosts, router, began
        stops = [host.stop.remote() for host in hosts]  # all at once: each may take a while
        for i, stop in enumerate(stops):
            try:
                code = ray.get(stop, timeout=60)
            except Exception as exc:  # said below, with what is left
                gone = {n["NodeID"] for n in ray.nodes() if not n["Alive"]}
                if homes[i] not in gone:  # (a removed node's host cannot stop: checked below)
                    problems.append(f"host {i} stop: {type(exc).__name__}: {exc}")
            else:
                if code != 0:
                    problems.append(f"host {i}: its daemon exited with {code}")
    limit = Deadline(what="every daemon gone from /dev/shm")
    while objects(shm_name(shm_prefix)) and time.monotonic() < limit.end:
        time.sleep(0.1)
    left = objects(shm_name(shm_prefix))
    if left:
        problems.append(f"left in /dev/shm 20 s after shutdown: {left}")
        problems += [f"still running: {p}" for p in daemons_of(shm_prefix)]
    assert not problems, problems


def daemons_of(prefix: str) -> list[str]:
    """The daemons named ``prefix``* still running: pid, state, parent, command."""
    found = []
    for p in psutil.process_iter(["cmdline", "status", "ppid"]):
        line = " ".join(p.info["cmdline"] or [])
        if prefix in line:
            found.append(f"{p.pid} {p.info['status']} ppid {p.info['ppid']}: {line}")
    return found


def frames_until(client: RayClient, want: dict[str, int]) -> dict[str, list[tuple[int, str]]]:
    """(chunk, path) per session until each session's newest chunk carries its tag."""
    got: dict[str, list[tuple[int, str]]] = {s: [] for s in want}
    latest: dict[str, int] = {}
    limit = Deadline(what=f"tags {want}")
    while any(latest.get(s) != t for s, t in want.items()):
        limit.check(latest)
        for frame in client.take(timeout=0.5):
            if frame.session in got:
                got[frame.session].append((frame.chunk, frame.path))
                latest[frame.session] = tag_of(frame.latent)
    return got


def test_sessions_spread_over_nodes_stay_and_survive_a_lost_node(
    cluster: tuple[Any, list[Any], Any, float],
) -> None:
    c, hosts, router, began = cluster
    client = RayClient(router, hosts)
    assert len({node for _, node in client.places}) == 3  # a daemon on each node
    for i in range(3):
        client.attach(f"s{i}")
    assert sorted(client.home.values()) == [0, 1, 2]  # most free rows first: one each
    paths = sorted(client.path(f"s{i}") for i in range(3))
    assert paths == ["ray", "ray", "shm"]  # this node's daemon in place, the others by Ray
    for i in range(3):
        client.act(f"s{i}", {"tag": 20 + i})
    got = frames_until(client, {f"s{i}": 20 + i for i in range(3)})
    for session, frames in got.items():  # sticky: every chunk from its one daemon, in order
        assert {path for _, path in frames} == {client.path(session)}
        chunks = [n for n, _ in frames]
        assert chunks == sorted(chunks)
    assert outside_addresses(ray_processes(began)) == []  # nothing but 127.0.0.1

    doomed = next(s for s in client.home if client.path(s) == "ray")
    dead_node = client.places[client.home[doomed]][1]
    node = next(n for n in c.worker_nodes if n.node_id == dead_node)
    c.remove_node(node, allow_graceful=False)
    limit = Deadline(what=f"{doomed} reported lost")
    while doomed not in client.lost:
        limit.check()
        client.take(timeout=0.2)
    with pytest.raises(EngineGone, match="is gone"):
        client.act(doomed, {"tag": 1})
    survivors = [s for s in client.home if s != doomed]
    client.attach(doomed)  # admitted again, on a live daemon
    assert client.places[client.home[doomed]][1] != dead_node
    client.act(doomed, {"tag": 30})
    want = {doomed: 30} | {s: 20 + int(s[1]) for s in survivors}
    again = frames_until(client, want)
    assert again[doomed][0][0] == 0 or again[doomed][0][0] < 4  # a new stream
    assert all(again[s] for s in survivors)  # the others streamed on
    client.close()


def test_the_scale_benchmark_measures_both_ray_paths(shm_prefix: str) -> None:
    from tools import bench_scale  # noqa: PLC0415 (tools run from a checkout)
    from tools.report import Progress  # noqa: PLC0415

    rows = bench_scale.ray_rows(1, 1, 2, 0.2, Progress("scale", 1), prefix=shm_prefix)
    assert [r["model"] for r in rows] == ["ray-local", "ray-remote"]
    for row in rows:
        assert row["chunks_per_s"] > 0 and row["p50_us"] > 0
    limit = Deadline(what="the benchmark's daemons gone from /dev/shm")
    while objects(shm_name(shm_prefix)):
        limit.check(objects(shm_name(shm_prefix)))
        time.sleep(0.1)


def test_callers_sharing_a_daemon_each_get_all_their_own_chunks(
    cluster: tuple[Any, list[Any], Any, float],
) -> None:
    """Two callers with a session on every daemon: a host keeps each caller's
    chunks for that caller (in their slots) while the other takes its own; no
    caller's stream has a gap (a host once handed them to whoever took first,
    who dropped what was not theirs)."""
    _, hosts, router, _ = cluster
    first, second = RayClient(router, hosts), RayClient(router, hosts)
    for i in range(3):
        first.attach(f"x{i}")
    for i in range(3):
        second.attach(f"y{i}")  # the rows left: one per daemon again
    assert sorted(first.home.values()) == sorted(second.home.values()) == [0, 1, 2]
    seen: dict[str, list[int]] = {}
    limit = Deadline(what="ten chunks of every session")
    while len(seen) < 6 or min(map(len, seen.values())) < 10:
        limit.check({s: len(v) for s, v in seen.items()})
        for client in (first, first, second):  # the first takes twice as often
            for frame in client.take(timeout=0.2):
                seen.setdefault(frame.session, []).append(frame.chunk)
    for session, chunks in seen.items():
        assert chunks == list(range(chunks[0], chunks[0] + len(chunks))), session
    first.close()
    second.close()
