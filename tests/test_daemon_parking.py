"""Parking through a real daemon: Suspend and Resume records, idle sessions, bit identity.

A client's session suspended at the daemon (its row freed, its state in the
daemon's host memory) and resumed goes on at its next chunk index, its frames
those of a twin in this process that was never suspended. The client methods
come later: the requests go through the client's transport as they will.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from daemon_harness import DaemonProcess

from rte import ComposedEngine, Notice, NoticeKind
from rte.client import ShmClient
from rte.errors import AdmissionError
from rte.ipc.inspect import snapshot
from rte.ipc.metrics import prometheus
from rte.models.learned import LearnedWorldModel
from rte.protocol.requests import Resume, Suspend

CHUNKS = 10


def twin_frames(chunks: int) -> dict[int, np.ndarray[Any, Any]]:
    """The frames of session ``a`` never suspended, in this process."""
    frames: dict[int, np.ndarray[Any, Any]] = {}
    with ComposedEngine(LearnedWorldModel(2)) as engine:
        engine.attach("a", {})
        while len(frames) < chunks:
            for r in engine.step(["a"]):
                if r.has_chunk:
                    frames[r.chunk] = np.array(r.latent)
    return frames


def collect(client: ShmClient, frames: dict[int, Any], until: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while len(frames) < until:
        assert time.monotonic() < deadline, f"only chunks {sorted(frames)} came"
        chunk = client.poll(timeout=0.5)
        if chunk is not None:
            with chunk:
                if chunk.session != "a":
                    continue
                assert chunk.chunk not in frames, f"chunk {chunk.chunk} came twice"
                frames[chunk.chunk] = np.array(chunk.latent)


def drain(client: ShmClient, frames: dict[int, Any], seconds: float) -> None:
    """Whatever chunks come in ``seconds``."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        chunk = client.poll(timeout=left)
        if chunk is not None:
            with chunk:
                frames[chunk.chunk] = np.array(chunk.latent)


def parked_figures(name: str, timeout: float = 5.0) -> dict[str, int]:
    """Each live session's parked bytes as ``rte inspect --json`` shows them, once one is."""
    deadline = time.monotonic() + timeout
    while True:
        clients = snapshot(name)["clients"]
        shown = {
            s["session"]: s["parked_bytes"]
            for c in clients
            for s in c.get("session_figures", [])
            if s["live"]
        }
        if any(shown.values()) or time.monotonic() > deadline:
            return shown
        time.sleep(0.05)


def answer(client: ShmClient, kind: NoticeKind, seq: int, timeout: float = 10.0) -> Notice:
    """The notice of ``kind`` answering ``seq`` (chunks that come meanwhile are kept)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for notice in client.notices():
            if notice.seq == seq or (seq == 0 and notice.kind is kind):
                assert notice.kind is kind, notice
                return notice
        client._pump(0.05)  # (no public wait for a notice alone yet)
    raise AssertionError(f"no {kind.name} for seq {seq}")


@pytest.fixture
def daemon(shm_prefix: str) -> Any:
    d = DaemonProcess(shm_prefix, "--model", "world", "--max-sessions", "2", "--park-idle-s", "0")
    yield d
    assert d.stop() == 0, d.stderr


def test_a_session_suspended_at_the_daemon_resumes_bit_identical(daemon: DaemonProcess) -> None:
    twin = twin_frames(CHUNKS)
    with daemon.client() as client:
        client.attach("a", {})
        frames: dict[int, Any] = {}
        collect(client, frames, 4)
        client.transport.send(Suspend("a", seq=901))
        answer(client, NoticeKind.SUSPENDED, 901)
        drain(client, frames, 0.3)  # what was sent before the suspend
        held = len(frames)
        drain(client, frames, 0.3)
        assert len(frames) == held  # suspended: nothing comes
        shown = parked_figures(daemon.name)
        assert shown["a"] > 10_000, shown  # rte inspect (--json) shows its state's bytes
        exposition = prometheus(snapshot(daemon.name))
        assert f'rte_sessions_parked{{daemon="{daemon.name}"}} 1' in exposition
        client.transport.send(Resume("a", seq=902))
        answer(client, NoticeKind.RESUMED, 902)
        collect(client, frames, CHUNKS)
        client.detach("a")
    assert sorted(frames)[:CHUNKS] == list(range(CHUNKS))  # no gap, no repeat
    for chunk in range(CHUNKS):
        np.testing.assert_array_equal(frames[chunk], twin[chunk], err_msg=f"chunk {chunk}")


def test_an_idle_session_is_parked_and_resumed_by_its_release(shm_prefix: str) -> None:
    args = ("--model", "world", "--max-sessions", "1", "--park-idle-s", "0.2", "--credits", "2")
    d = DaemonProcess(shm_prefix, *args, "--admission", "rows", "--quota", "8")
    try:
        twin = twin_frames(CHUNKS)
        with d.client() as client:
            client.attach("a", {})
            frames: dict[int, Any] = {}
            held = [client.poll(timeout=10.0) for _ in range(2)]  # its credits: it stalls
            assert all(c is not None for c in held)
            parked = answer(client, NoticeKind.SUSPENDED, 0)
            assert "idle" in parked.message
            with pytest.raises(AdmissionError, match="one per handle of its mailbox"):
                client.attach("c", {})  # (it was a protocol error: the client disconnected)
            with d.client() as other:  # the row a left: more sessions than rows
                other.attach("b", {})
                assert other.poll(timeout=10.0) is not None  # b runs (its chunk released)
                other.detach("b")
            for chunk in held:
                assert chunk is not None
                frames[chunk.chunk] = np.array(chunk.latent)
                chunk.release()  # credit back: it is due, and resumed
            collect(client, frames, CHUNKS)
            client.detach("a")
        for chunk in range(CHUNKS):
            np.testing.assert_array_equal(frames[chunk], twin[chunk], err_msg=f"chunk {chunk}")
    finally:
        assert d.stop() == 0, d.stderr
