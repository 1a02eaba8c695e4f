"""Sessions moving between the nodes of a real local Ray cluster (three nodes on
this machine, test_ray's fixture): ``RayClient.migrate`` from this node's daemon
to another node's and back, with no gap or repeat and the frames of a twin never
moved; a move refused by a full target goes back; ``drain``; and the state
crossing between nodes through Ray's object store (the hosts count what they
put there and fetched from there: bytes sent inline through an actor call's
arguments would count nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from ray_hosts import reference_hosts
from session_frames import frames_until
from test_migrate import _same_as, _twin
from test_ray import nodes  # noqa: F401 (the module's cluster)

from rte.errors import AdmissionError, RequestError
from rte.ray import RayClient  # first: Ray's environment

ray = pytest.importorskip("ray", reason="the ray extra (in the dev extra): pip install -e '.[ray]'")


@pytest.fixture
def hosts(nodes: tuple[Any, float], shm_prefix: str) -> Iterator[tuple[list[Any], Any]]:  # noqa: F811
    """A host per node, each a ``reference`` daemon of one row (a full one refuses)."""
    yield from reference_hosts(f"{shm_prefix}mv", 1)


def places(client: RayClient) -> tuple[int, list[int]]:
    """This node's host, and the others'."""
    here = ray.get_runtime_context().get_node_id()
    local = next(i for i, (_, node) in enumerate(client.places) if node == here)
    return local, [i for i in range(len(client.places)) if i != local]


def test_a_session_moves_to_another_node_and_back_its_frames_the_twins(
    hosts: tuple[list[Any], Any],
) -> None:
    """Migrated from this node's daemon to another node's (by that node's id) and
    back (by the daemon's name), a session's chunks go on from the next index each
    time, its frames those of a twin never moved; the remote host put the state
    it exported into the object store and fetched the one it took from there."""
    started, router = hosts
    twin = _twin({"a": 24})["a"]
    frames: dict[int, Any] = {}
    with RayClient(router, started) as client:
        local, remote = places(client)
        client.attach("a", {"prompt": "forest"})
        first = client.home["a"]
        if first != local:  # (placed by free rows: all equal)
            client.migrate("a", to=local)
        assert client.path("a") == "shm"
        frames_until(client, frames, 6)
        there = client.places[remote[0]]
        assert client.migrate("a", to=there[1]) == there[0]  # by its node's id
        assert client.home["a"] == remote[0] and client.path("a") == "ray"
        frames_until(client, frames, 14)
        assert client.migrate("a", to=client.places[local][0]) == client.places[local][0]
        assert client.path("a") == "shm" and client.sessions == {"a"}
        frames_until(client, frames, 24)
        counts = ray.get(started[remote[0]].relayed.remote(client.owner), timeout=30)
    _same_as(frames, twin, 24)
    # (placed first on that remote host, the session left it once more: in CI once)
    out = 2 if first == remote[0] else 1
    assert counts["states_in"] == 1 and counts["states_out"] == out, (counts, first, remote)


def test_a_move_refused_by_a_full_node_goes_back_and_drain_moves_it_on(
    hosts: tuple[list[Any], Any],
) -> None:
    """A full target refuses: the session is attached back where it was, going on
    with no gap or repeat (the caller is told); given the full one then a free
    one, it goes to the free one; a drain moves it off its host again. Every
    frame is the twin's."""
    started, router = hosts
    twin = _twin({"a": 30})["a"]
    frames: dict[int, Any] = {}
    with RayClient(router, started) as client, RayClient(router, started) as other:
        local, (full, free) = places(client)
        client.attach("a", {"prompt": "forest"})
        if client.home["a"] != local:
            client.migrate("a", to=local)
        frames_until(client, frames, 4)
        other.attach("x", wait=10)  # on a remote row (a roster may lag a move: asked again)
        if other.home["x"] != full:
            full, free = free, full
        with pytest.raises(AdmissionError, match="it is back on"):
            client.migrate("a", to=full)
        assert client.home["a"] == local and client.sessions == {"a"}
        frames_until(client, frames, 10)
        assert client.migrate("a", to=[full, free]) == client.places[free][0]
        assert client.home["a"] == free
        frames_until(client, frames, 18)
        with pytest.raises(RequestError, match="neither a daemon nor a node"):
            client.drain("elsewhere")
        assert client.drain(free) == {"a": client.places[local][0]}  # (the only free row)
        frames_until(client, frames, 30)
    _same_as(frames, twin, 30)
