"""One client holding more sessions than the daemon has rows (``--sessions-per-client``).

A gateway (one process serving many users, ``rte play``) is one client: its
mailbox has one session handle per session it may hold, parked ones included.
By default that is the rows; with ``--sessions-per-client`` past them and idle
parking on, the idle sessions park, each streams again when its chunks are
released, and its chunk indices go on with no gap, its frames those of a twin
never parked. Real daemons, real shared memory.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
from daemon_harness import DaemonProcess

from rte import ComposedEngine, NoticeKind
from rte.client import Chunk, ShmClient
from rte.errors import AdmissionError, ConfigurationError
from rte.ipc.checkpoints import read_checkpoint
from rte.ipc.inspect import snapshot
from rte.ipc.settings import Settings
from rte.models.learned import LearnedWorldModel
from rte.protocol.control import Control
from rte.protocol.names import DaemonNames
from shm import Segment

ROWS, HANDLES, CHUNKS = 2, 6, 6
SESSIONS = [f"user-{i}" for i in range(HANDLES)]
PARKING = ("--model", "world", "--max-sessions", str(ROWS), "--park-idle-s", "0.2")
PARKING_ARGS = (*PARKING, "--admission", "rows")


def twin_frames(sessions: list[str], chunks: int) -> dict[str, dict[int, Any]]:
    """Each session's frames never parked, all in rows of one engine in this process."""
    frames: dict[str, dict[int, Any]] = {s: {} for s in sessions}
    with ComposedEngine(LearnedWorldModel(len(sessions))) as engine:
        for session in sessions:
            engine.attach(session, {})
        while any(len(f) < chunks for f in frames.values()):
            for r in engine.step(list(sessions)):
                if r.has_chunk:
                    frames[r.session][r.chunk] = np.array(r.latent)
    return frames


class Held:
    """The chunks a client holds, per session, not yet released (their credit)."""

    def __init__(self, client: ShmClient) -> None:
        self.client = client
        self.chunks: dict[str, list[Chunk]] = {}
        self.suspended: set[str] = set()

    def pump(self, seconds: float) -> None:
        """Take whatever comes for ``seconds``: chunks held, SUSPENDED noted."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            chunk = self.client.poll(timeout=min(left, 0.05))
            if chunk is not None:
                self.chunks.setdefault(chunk.session, []).append(chunk)
            for notice in self.client.notices():
                if notice.kind is NoticeKind.SUSPENDED:
                    self.suspended.add(notice.session)
                elif notice.kind is NoticeKind.RESUMED:
                    self.suspended.discard(notice.session)

    def until_parked(self, sessions: list[str], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not set(sessions) <= self.suspended:
            assert time.monotonic() < deadline, f"parked: {sorted(self.suspended)} of {sessions}"
            self.pump(0.05)

    def release(self, session: str, frames: dict[int, Any]) -> None:
        """Consume ``session``'s held chunks (each index once, into ``frames``)."""
        for chunk in self.chunks.pop(session, []):
            assert chunk.chunk not in frames, f"{session}: chunk {chunk.chunk} came twice"
            frames[chunk.chunk] = np.array(chunk.latent)
            chunk.release()


@pytest.fixture
def gateway(shm_prefix: str) -> Any:
    d = DaemonProcess(shm_prefix, *PARKING_ARGS, "--sessions-per-client", str(HANDLES))
    yield d
    assert d.stop() == 0, d.stderr


def attach_past_the_rows(client: ShmClient, held: Held) -> None:
    """Attach every session, ROWS at a time: each batch parks (idle) before the next."""
    for at in range(0, HANDLES, ROWS):
        batch = SESSIONS[at : at + ROWS]
        for session in batch:
            client.attach(session, {})
        held.until_parked(batch)


def test_one_client_holds_three_times_the_rows_and_each_streams(gateway: DaemonProcess) -> None:
    twin = twin_frames(SESSIONS, CHUNKS)
    with gateway.client() as client:
        assert client.transport.control.layout.handles == HANDLES  # the word the client sized by
        held = Held(client)
        attach_past_the_rows(client, held)
        assert held.suspended == set(SESSIONS)  # more attached than rows: all parked now
        inspected = _inspected(gateway.name, client.index)
        assert {s["session"] for s in inspected} == set(SESSIONS), inspected
        assert all(s["parked_bytes"] > 10_000 for s in inspected), inspected
        shown = _inspect_text(gateway.name)
        assert "PARKED" in shown and all(s in shown for s in SESSIONS), shown
        frames: dict[str, dict[int, Any]] = {s: {} for s in SESSIONS}
        while any(len(f) < CHUNKS for f in frames.values()):  # consumed round-robin
            for session in SESSIONS:
                consume(held, session, frames[session])
        for session in SESSIONS:
            held.release(session, frames[session])
            client.detach(session)
    for session in SESSIONS:
        got = sorted(frames[session])
        assert got == list(range(len(got))), f"{session}: chunks {got}"  # no gap, no repeat
        for chunk in range(CHUNKS):
            np.testing.assert_array_equal(
                frames[session][chunk], twin[session][chunk], err_msg=f"{session} chunk {chunk}"
            )


def consume(held: Held, session: str, frames: dict[int, Any], timeout: float = 20.0) -> None:
    """A user's turn: ``session``'s chunks released as they come until two more came
    (the others' are held meanwhile: they idle and park, and give it a row)."""
    want, deadline = (
        min(len(frames) + 2 + len(held.chunks.get(session, [])), CHUNKS),
        (time.monotonic() + timeout),
    )
    while len(frames) < want:
        assert time.monotonic() < deadline, f"{session}: chunks {sorted(frames)} of {want}"
        held.release(session, frames)  # credit back: due, resumed once a row is free
        held.pump(0.05)


def _inspected(name: str, index: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The client's live sessions as ``rte inspect --json`` shows them, once all are parked."""
    deadline = time.monotonic() + timeout
    while True:
        clients = {c["index"]: c for c in snapshot(name)["clients"]}
        live = [s for s in clients[index].get("session_figures", []) if s["live"]]
        if (len(live) == HANDLES and all(s["parked_bytes"] for s in live)) or (
            time.monotonic() > deadline
        ):
            return live
        time.sleep(0.05)


def _inspect_text(name: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "rte", "inspect", name],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_the_setting_a_client_holds_no_more_sessions_than_rows(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix, *PARKING_ARGS)
    try:
        with d.client() as client:
            assert client.transport.control.layout.handles == ROWS
            held = Held(client)
            for session in SESSIONS[:ROWS]:
                client.attach(session, {})
            held.until_parked(SESSIONS[:ROWS])  # rows free, handles not
            with pytest.raises(AdmissionError, match=r"one per handle of its mailbox") as refused:
                client.attach(SESSIONS[ROWS], {})
            assert f"--sessions-per-client {ROWS}" in str(refused.value)
            assert f"({ROWS} parked)" in str(refused.value)
            with d.client() as other:  # another client may take the free row
                other.attach("elsewhere", {})
                chunk = other.poll(timeout=10.0)
                assert chunk is not None
                chunk.release()
                other.detach("elsewhere")
    finally:
        assert d.stop() == 0, d.stderr


def test_fewer_handles_than_rows_refuse_the_attach_past_them(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix, "--model", "null", "--max-sessions", "4", "--admission", "rows",
                      "--sessions-per-client", "1")  # fmt: skip
    try:
        with d.client() as client:
            client.attach("a", {})
            with pytest.raises(AdmissionError, match=r"holds 1 sessions, one per handle"):
                client.attach("b", {})  # rows free: the handles refuse, no parked one
            chunk = client.poll(timeout=10.0)  # a still streams
            assert chunk is not None and chunk.session == "a"
            chunk.release()
            client.detach("a")
    finally:
        assert d.stop() == 0, d.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--sessions-per-client", "0"), "--sessions-per-client 0: must be at least 1"),
        (("--sessions-per-client", "70000"), "--sessions-per-client 70000: at most 65,536"),
        (
            ("--max-sessions", "2", "--sessions-per-client", "4", "--park-bytes", "0"),
            "--park-bytes 0 parks no session",
        ),
        (("--sessions-per-client", "x"), "--sessions-per-client"),
    ],
)
def test_a_bad_value_is_refused_at_start_in_one_line(
    shm_prefix: str, args: tuple[str, ...], words: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rte", "serve", "--name", shm_prefix, *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert words in done.stderr, done.stderr


def test_the_handles_size_the_quota_the_mailboxes_and_the_figures() -> None:
    plain = Settings("d", max_sessions=4, credits=2)
    assert plain.handles == 4 and plain.client_quota == 4 * 3  # unchanged: rows x (credits + 1)
    more = Settings("d", max_sessions=4, credits=2, sessions_per_client=12)
    assert more.handles == 12
    assert more.client_quota == 12 * 2 + 4  # every session's credits, one in flight per row
    assert more.step_rows == plain.step_rows == 4  # a step still has at most the rows
    before, after = plain.segment_bytes(4096), more.segment_bytes(4096)
    assert after["control"] > before["control"] and after["slab"] > before["slab"]
    fewer = Settings("d", max_sessions=4, credits=2, sessions_per_client=1)
    assert fewer.client_quota == 3 and fewer.step_rows == 1
    with pytest.raises(ConfigurationError, match="--sessions-per-client 12 x --credits 2"):
        Settings("d", max_sessions=4, sessions_per_client=12, quota=20)


def test_the_control_segment_says_the_handles(gateway: DaemonProcess) -> None:
    with gateway.client() as client:
        layout = client.transport.control.layout
        assert (layout.handles, client.manifest.max_sessions) == (HANDLES, ROWS)
    with Segment.open(DaemonNames(gateway.name).control, readonly=True) as segment:
        assert Control(segment).layout.handles == HANDLES  # what an inspector reads too
    assert f"sessions_per_client={HANDLES}" in gateway.said()  # its ready line says it


def test_every_session_past_the_rows_is_checkpointed(shm_prefix: str) -> None:
    """The checkpoint segment had a slot per row: with sessions parked in turn past
    the rows, those after the first rows' were never checkpointed (silently)."""
    d = DaemonProcess(
        shm_prefix, *PARKING_ARGS, "--sessions-per-client", str(HANDLES), "--checkpoint-every", "1"
    )
    try:
        with d.client() as client:
            held = Held(client)
            attach_past_the_rows(client, held)
            frames: dict[str, dict[int, Any]] = {s: {} for s in SESSIONS}
            for session in SESSIONS:  # each stepped (and so checkpointed) in its turn
                consume(held, session, frames[session])
            d.kill()
        states = read_checkpoint(shm_prefix)
        assert sorted(states) == SESSIONS, sorted(states)
    finally:
        DaemonNames(shm_prefix).remove_leftovers()
