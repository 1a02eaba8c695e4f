"""``rte drain`` of a Ray host's daemon: a :class:`~rte.ray.RayClient` caller's
sessions there move to the other hosts at its next calls (as a pool client's
do), whether the drained daemon is on the caller's node (shared memory) or on
another (its host relays the DRAINING notices), each stream going on with no
gap or repeat and the frames of a twin never moved; a session no host takes
is kept in ``stranded`` with an ERROR notice, never lost."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from daemon_harness import Deadline
from ray_hosts import NODES, reference_hosts
from test_drain import record, rte_drain
from test_migrate import _same_as, _twin
from test_ray import nodes  # noqa: F401 (the module's cluster)

from rte.contract import NoticeKind
from rte.ray import RayClient  # first: Ray's environment

ray = pytest.importorskip("ray", reason="the ray extra (in the dev extra): pip install -e '.[ray]'")


@pytest.fixture
def hosts(nodes: tuple[Any, float], shm_prefix: str) -> Iterator[tuple[list[Any], Any]]:  # noqa: F811
    """A host per node, each a ``reference`` daemon of two rows."""
    yield from reference_hosts(f"{shm_prefix}rd", 2)


def _stream_until(client: RayClient, frames: dict[str, dict[int, Any]], until: int) -> None:
    limit = Deadline(what="the sessions' frames")
    while any(until not in frames.get(s, {}) for s in client.sessions):
        limit.check({s: sorted(f) for s, f in frames.items()})
        record(client, frames)


def _drain_while_streaming(
    client: RayClient, frames: dict[str, dict[int, Any]], daemon: str
) -> list[Any]:
    """``rte drain DAEMON`` while the caller polls; its notices meanwhile."""
    drain = rte_drain(daemon, "--timeout", "30")
    notices: list[Any] = []
    limit = Deadline(what="rte drain", seconds=60)
    while drain.poll() is None:  # the caller streams, and moves at its polls
        limit.check()
        record(client, frames)
        notices += client.notices()
    said, err = drain.communicate()
    assert drain.returncode == 0, f"{said}\n{err}"
    assert f"{daemon} drained: " in said, said
    return notices


def test_rte_drain_moves_a_ray_callers_sessions_off_a_local_and_a_remote_daemon(
    hosts: tuple[list[Any], Any],
) -> None:
    """Session ``a`` on this node's daemon, ``b`` on another node's: ``rte drain``
    of each daemon in turn moves its session to another host while the caller
    streams; every chunk index comes once, in order, each frame the twin's."""
    started, router = hosts
    twins = _twin({"a": 40, "b": 40})
    frames: dict[str, dict[int, Any]] = {}
    here = ray.get_runtime_context().get_node_id()
    with RayClient(router, started) as client:
        local = next(i for i, (_, node) in enumerate(client.places) if node == here)
        remote = next(i for i in range(NODES) if i != local)
        for session, host in (("a", local), ("b", remote)):
            client.attach(session, {"prompt": "forest"}, timeout=30)  # (a loaded box)
            if client.home[session] != host:
                client.migrate(session, to=host, timeout=30)
        assert client.path("a") == "shm" and client.path("b") == "ray"
        _stream_until(client, frames, 5)
        for session, host in (("a", local), ("b", remote)):
            daemon = client.places[host][0]
            notices = _drain_while_streaming(client, frames, daemon)
            assert client.home[session] != host, f"{session} is still on {daemon}"
            told = [n for n in notices if n.kind is NoticeKind.DRAINING and n.session == session]
            assert told, notices  # the caller saw why it moved
            assert not [n for n in notices if n.kind is NoticeKind.ERROR], notices
        _stream_until(client, frames, 30)
        assert client.stranded == {}
    for session in ("a", "b"):
        got = {i: f for i, f in frames[session].items() if i <= 30}
        _same_as(got, twins[session], 30)
