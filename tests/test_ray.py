"""rte on a real local Ray cluster (three nodes on this machine, every Ray process
on 127.0.0.1, one cluster for the module): a daemon per node placed by
resources, sessions spread and sticky, this node's daemon through shared memory
and the others' chunks pushed by their hosts, a killed node's sessions reported
and admitted again elsewhere, and nothing left behind. The behaviour tests of
tests/test_client.py run here on RayClient too, its daemon on this node
(``ray-local``) and on another (``ray-remote``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from daemon_harness import Deadline

from rte.client import EngineClient, EngineGone
from rte.models.null import tag_of
from rte.ray import DaemonHost, RayClient, Router, local_cluster, start_hosts  # first: Ray's env
from rte.ray.cluster import node_args
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


def test_the_scale_benchmark_measures_both_ray_paths(shm_prefix: str) -> None:
    """First in the module: it starts a cluster of its own (one per process at a time)."""
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


# the behaviour tests, run here on the ray forms: imported after the benchmark's test, so
# that it runs first (it starts a cluster of its own; one at a time per process)
from test_client import (  # noqa: E402, F401
    test_a_client_is_a_context_manager,
    test_a_consumer_that_stops_reading_stalls_without_growing,
    test_a_large_input_reaches_the_engine_by_value_or_by_loan,
    test_admission_beyond_capacity_then_rows_are_reused,
    test_an_action_shows_in_every_later_chunk,
    test_attaching_a_session_again_keeps_it_streaming,
    test_both_forms_refuse_what_the_wire_cannot_carry,
    test_calls_after_close_raise_client_closed,
    test_chunks_arrive_in_order_shaped_and_read_only,
    test_credits_the_quota_cannot_hold_are_refused_at_attach,
    test_detach_ends_the_stream_after_its_in_flight_chunk,
    test_refused_requests_raise_or_tell_and_change_nothing,
    test_reset_restarts_identically_and_a_refused_one_changes_nothing,
)
from test_migrate import (  # noqa: E402, F401 (export on both paths: a slot here, an ObjectRef there)
    test_an_export_refused_leaves_the_others_as_they_were,
    test_an_exported_session_goes_on_elsewhere_as_its_twin,
)

NODES = 3


@pytest.fixture(scope="module")
def nodes() -> Iterator[tuple[Any, float]]:
    """The module's cluster (three nodes, one rte_gpu each) and when it began."""
    began = time.time()
    with local_cluster([{"rte_gpu": 1}] * NODES) as c:
        yield c, began


@pytest.fixture
def cluster(
    nodes: tuple[Any, float], shm_prefix: str
) -> Iterator[tuple[Any, list[Any], Any, float]]:
    c, began = nodes
    problems: list[str] = []
    hosts, router = start_hosts(
        ["--model", "null", "--max-sessions", "2"], NODES, name=f"{shm_prefix}h"
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
    for actor in [*hosts, router]:
        ray.kill(actor)
    while len([n for n in ray.nodes() if n["Alive"]]) < NODES:  # a test removed one
        c.add_node(**node_args({"rte_gpu": 1}))
        c.wait_for_nodes(timeout=60)
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


# -- the behaviour tests of test_client.py, on RayClient ----------------------------

ROWS = 3


class RayEngines:
    """test_client's Engines for the ray forms: per model a host (its daemon with
    test_client's sizes) on this caller's node or another, and its own router."""

    def __init__(self, form: str, prefix: str) -> None:
        self.form, self.prefix = form, prefix
        self.actors: dict[str, tuple[Any, Any]] = {}  # model -> (host, router)
        self.clients: list[EngineClient] = []

    def client(self, model: str = "reference") -> EngineClient:
        from ray.util.scheduling_strategies import (  # noqa: PLC0415
            NodeAffinitySchedulingStrategy,
        )

        if model not in self.actors:
            here = ray.get_runtime_context().get_node_id()
            alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
            node = here if self.form == "ray-local" else next(n for n in alive if n != here)
            args = ["--model", model, "--max-sessions", str(ROWS), "--max-clients", "4"]
            on = NodeAffinitySchedulingStrategy(node, soft=False)
            host = (
                ray.remote(num_cpus=0, max_restarts=0)(DaemonHost)
                .options(scheduling_strategy=on)
                .remote(f"{self.prefix}{model}", args)
            )
            router = ray.remote(num_cpus=0)(Router).remote([host])
            self.actors[model] = (host, router)
        host, router = self.actors[model]
        client = RayClient(router, [host])
        assert client.places[0][1] == ray.get_runtime_context().get_node_id() or (
            self.form == "ray-remote"
        )
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for host, router in self.actors.values():
            assert ray.get(host.stop.remote(), timeout=60) == 0
            ray.kill(host)
            ray.kill(router)


@pytest.fixture(params=["ray-local", "ray-remote"])
def engine(
    request: pytest.FixtureRequest, nodes: tuple[Any, float], shm_prefix: str
) -> Iterator[RayEngines]:
    engines = RayEngines(request.param, shm_prefix)
    yield engines
    engines.close()


# -- the two paths: at the speed of the node, pushed from the others --------------


def test_a_local_session_streams_on_while_another_nodes_host_is_stopped(
    cluster: tuple[Any, list[Any], Any, float],
) -> None:
    """This node's session goes through shared memory and its waits never ask
    another host: with a remote host's actor stopped (SIGSTOP), every action on
    the local session shows within the deadline (the client once waited 5 s on
    each remote host in every take)."""
    _, hosts, router, _ = cluster
    client = RayClient(router, hosts)
    for i in range(3):
        client.attach(f"s{i}")
    local = next(s for s in client.home if client.path(s) == "shm")
    remote = next(s for s in client.home if client.path(s) == "ray")
    take_until(client, remote, 1)  # streaming: its host has pushed
    host = hosts[client.home[remote]]
    stopped = psutil.Process(ray.get(host.pid.remote(), timeout=30))
    stopped.suspend()
    try:
        limit = Deadline(seconds=10, what="ten actions shown on the local session")
        for tag in range(1, 11):
            client.act(local, {"tag": tag})
            while not any(f.session == local and tag_of(f.latent) == tag for f in client.take(0.2)):
                limit.check(tag)
    finally:
        stopped.resume()
    client.close()


def take_until(client: RayClient, session: str, count: int) -> list[Any]:
    frames: list[Any] = []
    limit = Deadline(what=f"{count} chunks of {session}")
    while len(frames) < count:
        limit.check(len(frames))
        frames += [f for f in client.take(0.2) if f.session == session]
    return frames


def test_the_ray_benchmark_measures_rays_own_floor_on_another_node(
    nodes: tuple[Any, float],
) -> None:
    """tools.bench_ray's floor (what a remote session pays before rte does anything):
    an idle actor on another node, its calls timed and its stream's items all
    taken, each stamped where it was yielded."""
    from tools import bench_ray  # noqa: PLC0415 (tools run from a checkout)

    here = ray.get_runtime_context().get_node_id()
    there = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here)
    actor = bench_ray.floor_actor(there)
    try:
        assert ray.get(actor.node.remote(), timeout=60) == there  # the other node, not this one
        floor = bench_ray.ray_floor(actor, calls=20, items=50)
        assert set(floor) == set(bench_ray.FLOOR), floor
        assert 0 < floor["call_p50_us"] <= floor["call_p99_us"], floor
        assert 0 < floor["item_p50_us"] <= floor["item_p99_us"], floor
        assert floor["stream_items_per_s"] > 0, floor
    finally:
        ray.kill(actor)


def test_a_remote_sessions_chunks_are_pushed_a_message_per_step_and_released_in_bulk(
    cluster: tuple[Any, list[Any], Any, float],
) -> None:
    """A session on another node: its host pushes its chunks (the caller asks it
    for none), a message per wake-up, each step's chunks one batch; the caller's
    releases go back gathered, so its slots are all given back, and its stream
    is in order without a gap."""
    _, hosts, router, _ = cluster
    client = RayClient(router, hosts)
    for i in range(3):
        client.attach(f"s{i}")
    remote = next(s for s in client.home if client.path(s) == "ray")
    host = hosts[client.home[remote]]
    frames = take_until(client, remote, 30)
    assert all(f.path == "ray" for f in frames)
    chunks = [f.chunk for f in frames]
    assert chunks == list(range(chunks[0], chunks[0] + len(chunks)))
    counts = ray.get(host.relayed.remote(client.owner), timeout=30)
    assert counts["steps"] >= 30 and counts["messages"] <= counts["steps"]
    assert 0 < counts["give_backs"] <= counts["messages"]  # at most one per message
    client.close()


@pytest.mark.parametrize("window", [0, 3])
def test_a_remote_session_runs_its_window_ahead_of_a_caller_that_stops_reading(
    cluster: tuple[Any, list[Any], Any, float], window: int
) -> None:
    """A session on another node: its host gives its rows back to the daemon as
    their step is sent while the session has room in its window (rte.ray.window),
    so a caller that reads and releases nothing holds its credits plus the window,
    and then nothing more comes (credits hold end to end); once it releases, the
    stream goes on from where it was, without a gap or a repeat."""
    _, hosts, _, _ = cluster
    here = ray.get_runtime_context().get_node_id()
    places = ray.get([h.where.remote() for h in hosts], timeout=30)
    far = next(i for i, (_, node) in enumerate(places) if node != here)
    router = ray.remote(num_cpus=0)(Router).remote([hosts[far]])
    client = RayClient(router, [hosts[far]], window=window)
    try:
        client.attach("far", credits=2)
        assert client.path("far") == "ray"
        held = []
        limit = Deadline(what=f"credits 2 + window {window} chunks held")
        while sum(len(b) for b in held) < 2 + window:
            limit.check(len(held))
            batch = client.poll_batch(timeout=0.5)
            if batch is not None:
                held.append(batch)
        assert client.poll_batch(timeout=1.0) is None  # nothing more while none is released
        chunks = [c for b in held for c in b.chunks.tolist()]
        assert len(chunks) == 2 + window
        for b in held:
            b.release()
        chunks += [f.chunk for f in take_until(client, "far", 4)]
        assert chunks[: 2 + window + 4] == list(range(2 + window + 4))
    finally:
        client.close()
        ray.kill(router)


def test_a_caller_that_only_polls_without_waiting_gives_its_releases_back(
    cluster: tuple[Any, list[Any], Any, float],
) -> None:
    """Releases are gathered until half a window (rte.ray.window), but never kept
    from a host that waits for them: a caller that only polls with timeout 0 (a
    game loop's frame check; it never sleeps) and has a release gathered when its
    session stalls gets it back to the host at its next poll that finds nothing,
    so its session goes on (it waited for ever: the gathered release was sent only
    before a sleep, or once half a window was gathered)."""
    _, hosts, _, _ = cluster
    here = ray.get_runtime_context().get_node_id()
    places = ray.get([h.where.remote() for h in hosts], timeout=30)
    far = next(i for i, (_, node) in enumerate(places) if node != here)
    router = ray.remote(num_cpus=0)(Router).remote([hosts[far]])
    client = RayClient(router, [hosts[far]], window=4)  # 2 credits + 4: 6 out; sent at 2
    try:
        client.attach("far", credits=2)
        kept = []
        limit = Deadline(what="6 chunks, polled without waiting")
        while len(kept) < 6:
            limit.check(len(kept))
            batch = client.poll_batch(timeout=0)
            if batch is None:
                time.sleep(0.001)
                continue
            kept.append(batch)
        last = kept.pop()  # five kept; the sixth released: one release gathered
        last.release()
        limit = Deadline(what="a seventh chunk, polled without waiting")
        while (batch := client.poll_batch(timeout=0)) is None:
            limit.check()
            time.sleep(0.001)
        assert batch.chunks.tolist() == [6]
        batch.release()
        for held in kept:
            held.release()
    finally:
        client.close()
        ray.kill(router)
