"""Checkpoints through a real daemon: they outlive its SIGKILL, resume exactly, refuse damage.

A daemon started with ``--checkpoint-every K`` is killed mid-stream; its
checkpoint segment is read (:func:`rte.ipc.checkpoints.read_checkpoint`) and
the session resumed in a fresh engine of this process: fewer than K chunks (and
those in flight) are lost, and every frame from there is the frame of a twin
never interrupted. A torn checkpoint falls back to the older half, one with no
sound half is refused; a live daemon's is refused; the restarted daemon keeps a
dead one's until its session is attached again, and ``rte clean`` removes it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from daemon_harness import DaemonProcess
from test_daemon_parking import collect, twin_frames

from rte import ComposedEngine
from rte.errors import StateError
from rte.ipc.checkpoints import read_checkpoint
from rte.models.learned import LearnedWorldModel
from rte.protocol.names import DaemonNames
from shm.names import SHM_DIR

EVERY = 3
ARGS = ("--model", "world", "--max-sessions", "2", "--checkpoint-every", str(EVERY))


def _killed_mid_stream(name: str, chunks: int = 10) -> int:
    """Stream session ``a`` for ``chunks`` chunks, then SIGKILL its daemon; the last
    chunk index received."""
    d = DaemonProcess(name, *ARGS)
    try:
        client = d.client()
        client.attach("a", {})
        frames: dict[int, Any] = {}
        collect(client, frames, chunks)
        assert DaemonNames(name).checkpoints(), "no checkpoint was written"
        with pytest.raises(StateError, match="live daemon"):
            read_checkpoint(name)
    finally:
        d.kill()
    return max(frames)


def _resumed_frames(states: dict[str, Any], until: int) -> dict[int, np.ndarray[Any, Any]]:
    frames: dict[int, np.ndarray[Any, Any]] = {}
    with ComposedEngine(LearnedWorldModel(2)) as engine:
        engine.resume("a", states["a"])
        for _ in range(until + 3):
            for r in engine.step(["a"]):
                if r.has_chunk:
                    frames[r.chunk] = np.array(r.latent)
    return frames


def test_a_killed_daemons_checkpoint_resumes_exactly_where_it_was(shm_prefix: str) -> None:
    try:
        last = _killed_mid_stream(shm_prefix)
        states = read_checkpoint(shm_prefix)
        state = states["a"]
        first = state.chunk - len(state.pending)  # the first chunk the resumed one emits
        assert last + 1 - first <= EVERY + 3, (last, first)  # <= K, plus credits in flight
        assert state.host["act_seq"] == 0
        twin = twin_frames(first + 6)
        resumed = _resumed_frames(states, 6)
        assert min(resumed) == first
        for chunk in range(first, first + 6):
            np.testing.assert_array_equal(resumed[chunk], twin[chunk], err_msg=f"chunk {chunk}")
    finally:
        DaemonNames(shm_prefix).remove_leftovers()


def _half_epochs(path: Any) -> list[tuple[int, int]]:
    """(offset, epoch) of each written half of the first slot."""
    raw = path.read_bytes()
    from rte.ipc.checkpoints import _HALF, _TABLE  # noqa: PLC0415 (the layout under test)
    from shm.segment import HEADER_SIZE  # noqa: PLC0415

    _, _, _, slot_bytes = _TABLE.unpack_from(raw, HEADER_SIZE)
    halves = []
    for half in (0, 1):
        at = HEADER_SIZE + _TABLE.size + half * slot_bytes
        epoch, _ = _HALF.unpack_from(raw, at)
        halves.append((at + _HALF.size + 40, epoch))  # a byte inside the state's body
    return halves


def test_a_torn_checkpoint_falls_back_and_a_garbled_one_is_refused(shm_prefix: str) -> None:
    try:
        _killed_mid_stream(shm_prefix)
        whole = read_checkpoint(shm_prefix)["a"]
        name = next(iter(DaemonNames(shm_prefix).checkpoints().values()))
        path = SHM_DIR / name.lstrip("/")
        halves = sorted(_half_epochs(path), key=lambda h: -h[1])
        assert all(epoch for _, epoch in halves), "both halves written"
        data = bytearray(path.read_bytes())
        data[halves[0][0]] ^= 0xFF  # the newest half torn
        path.write_bytes(bytes(data))
        older = read_checkpoint(shm_prefix)["a"]
        assert older.chunk == whole.chunk - EVERY  # the previous checkpoint, sound
        data[halves[1][0]] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(StateError, match="no sound state"):
            read_checkpoint(shm_prefix)
    finally:
        DaemonNames(shm_prefix).remove_leftovers()


def test_the_restarted_daemon_keeps_a_dead_checkpoint_until_its_session_is_back(
    shm_prefix: str,
) -> None:
    names = DaemonNames(shm_prefix)
    try:
        _killed_mid_stream(shm_prefix, chunks=4)
        dead = names.checkpoints()
        d = DaemonProcess(shm_prefix, *ARGS)
        try:
            with d.client() as client:
                assert names.checkpoints() == dead  # its leftovers replaced, the checkpoint kept
                assert set(read_checkpoint(shm_prefix)) == {"a"}
                client.attach("a", {})  # (a pool would resume it; attached here: taken)
                deadline = time.monotonic() + 10
                while set(names.checkpoints()) & set(dead):
                    assert time.monotonic() < deadline, "the dead checkpoint stayed"
                    client.poll(timeout=0.1)
                client.detach("a")
        finally:
            assert d.stop() == 0, d.stderr
        assert names.checkpoints() == {}  # its own went with its clean stop
        _killed_mid_stream(shm_prefix, chunks=4)
        assert names.checkpoints()
        removed = names.remove_leftovers()  # what rte clean does
        assert any(".k" in r for r in removed) and names.checkpoints() == {}
    finally:
        names.remove_leftovers()


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "flat"])
def test_sessions_checkpointed_in_one_step_stream_on_as_their_twins(
    shm_prefix: str, pipelined: bool
) -> None:
    """Sessions due a checkpoint in the same step are taken out together (one export,
    one decode of their chunks in flight: ComposedEngine.suspend_many) and put back:
    every frame is still the twin's, and each one's checkpoint is in the segment."""
    from rte import Attach, ServeLoop  # noqa: PLC0415
    from rte.ipc.checkpoints import Checkpoints  # noqa: PLC0415

    def frames(every: int) -> tuple[dict[str, dict[int, Any]], list[str]]:
        engine = ComposedEngine(LearnedWorldModel(3, pipelined=pipelined))
        loop = ServeLoop(engine, admission="rows")
        writer = Checkpoints(DaemonNames(shm_prefix), every, 3) if every else None
        made: dict[str, dict[int, Any]] = {}
        try:
            for s in ("a", "b", "c"):
                loop.handle(Attach(s, {"prompt": f"a forest {s}"}))
            for _ in range(12):
                due = loop.sessions
                for r in loop.step(due):
                    if getattr(r, "has_chunk", False):
                        made.setdefault(r.session, {})[r.chunk] = np.array(r.latent)
                engine.lanes.drain()
                if writer is not None:
                    writer.after_step(loop, due)
            kept = sorted(writer._slots) if writer is not None else []
            return made, kept
        finally:
            if writer is not None:
                writer.close()
            engine.close()

    twin, _ = frames(0)
    checkpointed, kept = frames(2)
    assert kept == ["a", "b", "c"]
    for s in ("a", "b", "c"):
        assert sorted(checkpointed[s]) == sorted(twin[s]) and len(twin[s]) >= 9, s
        for chunk, frame in twin[s].items():
            np.testing.assert_array_equal(checkpointed[s][chunk], frame, err_msg=f"{s} {chunk}")
