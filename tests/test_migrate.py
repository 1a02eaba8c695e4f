"""Export: a session's state handed back to its client on every form (in process:
the state itself; through a daemon: written into a slot of the client's own input
segment, not through the ring), then attached elsewhere, going on as its twin."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import test_client
from daemon_harness import DaemonProcess, Deadline, take
from test_client import Engines, _frames_until

from rte.client import EngineClient, InProcessClient, connect_pool
from rte.composed import ComposedEngine
from rte.errors import AdmissionError, RequestError, UnknownSessionError
from rte.models import load_model
from rte.protocol.names import DaemonNames
from rte.state import SessionState

engine = test_client.engine  # the fixture of the six client forms


def test_an_exported_session_goes_on_elsewhere_as_its_twin(engine: Engines) -> None:
    """Exported, a session leaves its engine; attached with that state on another
    engine, its chunk indices go on with no gap or repeat, its frames the twin's."""
    with InProcessClient(ComposedEngine(load_model("reference", max_sessions=1))) as alone:
        alone.attach("a", {"prompt": "forest"})
        twin = _frames_until(alone, {"a": 10})["a"]
    client = engine.client()
    client.attach("a", {"prompt": "forest"}, credits=1)
    before = _frames_until(client, {"a": 3})["a"]
    state = client.export("a")
    assert isinstance(state, SessionState)
    assert "a" not in client.sessions
    while (chunk := client.poll(timeout=0.3)) is not None:  # emitted before it left: still ours
        with chunk:
            assert chunk.chunk not in before, "a chunk came twice"
            before[chunk.chunk] = chunk.latent.copy()
    with pytest.raises(RequestError, match="'a' is not attached"):
        client.export("a")  # gone: nothing to export
    with InProcessClient(ComposedEngine(load_model("reference", max_sessions=1))) as there:
        there.attach("a", state=state)
        after = _frames_until(there, {"a": 10})["a"]
    frames = {**before, **after}
    assert sorted(frames) == list(range(11)), "a gap in its chunk indices"
    for index, frame in frames.items():
        np.testing.assert_array_equal(frame, twin[index], err_msg=f"chunk {index}")


def test_an_export_refused_leaves_the_others_as_they_were(engine: Engines) -> None:
    client = engine.client()
    client.attach("a")
    with pytest.raises(RequestError, match="'ghost' is not attached"):
        client.export("ghost")
    got = [c.chunk for c in take(client, "a", 3)]
    assert got == list(range(got[0], got[0] + 3)) and client.sessions == {"a"}


# -- a pool moving sessions between two real daemons ------------------------------

PACE_HZ = 30.0


@pytest.fixture
def pair(shm_prefix: str) -> Iterator[list[DaemonProcess]]:
    """Two paced daemons of the reference model, one row each (a full one refuses)."""
    started = [
        DaemonProcess(
            f"{shm_prefix}m-{i}",
            "--model",
            "reference",
            "--max-sessions",
            "1",
            "--pace-hz",
            str(PACE_HZ),
        )
        for i in range(2)
    ]
    yield started
    for d in started:
        if d.process.poll() is None:
            assert d.stop() == 0, d.stderr
        DaemonNames(d.name).remove_leftovers()


def _twin(sessions: dict[str, int]) -> dict[str, dict[int, Any]]:
    """The frames of sessions never moved, on an engine of this process."""
    with InProcessClient(ComposedEngine(load_model("reference", max_sessions=2))) as alone:
        for session in sessions:
            alone.attach(session, {"prompt": "forest"})
        return _frames_until(alone, sessions)


def _timed(
    client: EngineClient, frames: dict[int, Any], times: dict[int, float], until: int
) -> None:
    """Session ``a``'s frames (and when each was polled) until chunk ``until``."""
    limit = Deadline(what="the session's frames")
    while until not in frames:
        limit.check(sorted(frames))
        chunk = client.poll(timeout=1.0)
        if chunk is None:
            continue
        with chunk:
            assert chunk.chunk not in frames, f"chunk {chunk.chunk} came twice"
            frames[chunk.chunk], times[chunk.chunk] = chunk.latent.copy(), time.monotonic()


def _same_as(frames: dict[int, Any], twin: dict[int, Any], until: int) -> None:
    assert sorted(frames) == list(range(until + 1)), "a gap in its chunk indices"
    for index, frame in frames.items():
        np.testing.assert_array_equal(frame, twin[index], err_msg=f"chunk {index}")


def test_migrate_moves_a_session_between_daemons_with_no_gap_its_frames_the_twins(
    pair: list[DaemonProcess],
) -> None:
    """Migrated while streaming, a session's chunks go on from the next index (those
    emitted before the export come first, from the old daemon), its frames the
    twin's; the stall the client sees is printed in periods of the pace."""
    twin = _twin({"a": 20})["a"]
    frames: dict[int, Any] = {}
    times: dict[int, float] = {}
    with connect_pool([d.name for d in pair], timeout=30) as client:
        client.attach("a", {"prompt": "forest"})
        old = client.home["a"]
        to = next(d.name for d in pair if d.name != old)
        _timed(client, frames, times, 6)
        assert client.migrate("a", to=to) == to
        assert client.home["a"] == to and client.sessions == {"a"}
        _timed(client, frames, times, 20)
    _same_as(frames, twin, 20)
    gaps = [times[i + 1] - times[i] for i in range(6, 20)]
    print(f"\nmigration stall: {max(gaps) * PACE_HZ:.2f} periods at {PACE_HZ:g} Hz")


def test_a_migration_refused_goes_back_where_it_was_and_loses_nothing(
    pair: list[DaemonProcess],
) -> None:
    """The target full, the session is attached back on its old daemon: it goes on
    with no gap or repeat, its frames the twin's, and the caller is told."""
    twin = _twin({"a": 12})["a"]
    full, free = pair
    with full.client() as other:
        other.attach("x")  # its one row taken
        frames: dict[int, Any] = {}
        with connect_pool([d.name for d in pair], timeout=30) as client:
            client.attach("a", {"prompt": "forest"})
            assert client.home["a"] == free.name
            _timed(client, frames, {}, 4)
            with pytest.raises(AdmissionError, match=f"back on '{free.name}'"):
                client.migrate("a", to=full.name)
            assert client.home["a"] == free.name and client.sessions == {"a"}
            _timed(client, frames, {}, 12)
    _same_as(frames, twin, 12)


def test_drain_moves_every_session_of_the_client_off_a_daemon(shm_prefix: str) -> None:
    """Drained, a daemon holds none of the client's sessions: each went on elsewhere
    with no gap, its frames the twin's; a wrong name or session is refused."""
    names = [f"{shm_prefix}d-{i}" for i in range(2)]
    started = [DaemonProcess(n, "--model", "reference", "--max-sessions", "2") for n in names]
    try:
        with connect_pool(names, timeout=30) as client:
            client.attach("a", {"prompt": "forest"})
            client.attach("b", {"prompt": "forest"})
            assert {client.home["a"], client.home["b"]} == set(names)  # spread
            before = _frames_until(client, {"a": 3, "b": 3})
            with pytest.raises(RequestError, match="not a daemon of pool"):
                client.drain("elsewhere")
            with pytest.raises(RequestError, match="already"):
                client.migrate("a", to=client.home["a"])
            with pytest.raises(UnknownSessionError, match="'ghost' is not attached"):
                client.migrate("ghost", to=names[1])
            on_first = {s for s in "ab" if client.home[s] == names[0]}
            assert client.drain(names[0]) == dict.fromkeys(on_first, names[1])
            assert all(client.home[s] == names[1] for s in "ab")
            # (each 9 past where it was: one may run far ahead of the other while
            # that one starts; in CI "a" was at 15 when "b" reached 3)
            after = _frames_until(client, {s: max(before[s]) + 9 for s in "ab"})
        frames = {s: {**before[s], **after[s]} for s in "ab"}
        twin = _twin({s: max(frames[s]) for s in "ab"})
        for s in "ab":
            _same_as(frames[s], twin[s], max(frames[s]))
    finally:
        for d in started:
            if d.process.poll() is None:
                assert d.stop() == 0, d.stderr
            DaemonNames(d.name).remove_leftovers()


def test_a_moved_session_whose_new_daemon_dies_is_reattached_with_its_conditioning(
    pair: list[DaemonProcess],
) -> None:
    """A move keeps what a reattach sends: the session's conditioning, not the state
    it moved with (that would take it back to the chunk it moved at)."""
    twin = _twin({"a": 5})["a"]
    with connect_pool([d.name for d in pair], timeout=30, reattach=True) as client:
        client.attach("a", {"prompt": "forest"})
        old = client.home["a"]
        to = next(d for d in pair if d.name != old)
        _timed(client, {}, {}, 6)
        client.migrate("a", to=to.name)
        _timed(client, {}, {}, 9)
        to.kill()
        frames: dict[int, Any] = {}
        limit = Deadline(what="the reattached session's first chunks")
        while len(frames) < 5:
            limit.check(sorted(frames))
            chunk = client.poll(timeout=1.0)
            if chunk is not None:
                with chunk:
                    if chunk.chunk < 9 or frames:  # (one of before the kill: not its restart)
                        frames[chunk.chunk] = chunk.latent.copy()
        assert client.home["a"] == old
    assert sorted(frames) == list(range(5)), "it did not restart at chunk 0"
    for index, frame in frames.items():
        np.testing.assert_array_equal(frame, twin[index], err_msg=f"chunk {index}")
