"""``rte drain`` attacked on purpose: real daemons, real client processes, the
command itself. A drain must never say a daemon is empty while a session is
still on it (or on its way back to it), its timeout holds against a daemon
that stopped answering, a garbled record never drains a daemon, and a session
its client suspended stays suspended where it moves to."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from daemon_harness import DaemonProcess, Deadline, RawClient, wait_for

from rte.client import NoticeKind, RequestError, connect_pool
from rte.contract import Notice
from rte.ipc.inspect import summary
from rte.protocol.names import DaemonNames
from rte.protocol.wire import HEADER, RecordType, decode_reply

PACE_HZ = 30.0


def _pool(shm_prefix: str, paces: tuple[float, float]) -> Iterator[list[DaemonProcess]]:
    started = [
        DaemonProcess(
            f"{shm_prefix}p-{i}",
            *("--model", "reference", "--max-sessions", "2", "--pace-hz", str(pace)),
        )
        for i, pace in enumerate(paces)
    ]
    try:
        for d in started:
            d.client().close()
        yield started
    finally:
        for d in started:
            os.kill(d.pid, signal.SIGCONT)  # (a test may have frozen it)
            assert d.stop() == 0, d.stderr
            DaemonNames(d.name).remove_leftovers()


@pytest.fixture
def pool(shm_prefix: str) -> Iterator[list[DaemonProcess]]:
    """Two paced daemons of the reference model, NAME-0 and NAME-1, two rows each."""
    yield from _pool(shm_prefix, (PACE_HZ, PACE_HZ))


@pytest.fixture
def slow_pool(shm_prefix: str) -> Iterator[list[DaemonProcess]]:
    """The same, NAME-1 paced at 3 Hz: it answers an attach a third of a second late."""
    yield from _pool(shm_prefix, (PACE_HZ, 3.0))


def rte_drain(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rte", "drain", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_session_whose_move_keeps_bouncing_back_is_never_reported_drained(
    slow_pool: list[DaemonProcess],
) -> None:
    """The other daemon full, a pool's session is exported, refused there and
    attached back, once a second. Between its export and its return (the
    other's refusal: up to a third of a second here) the daemon held no
    session: ``rte drain`` read 0 there and said "drained" (exit 0; with
    --stop it would have stopped the daemon under the session). Now a told
    session out on its move counts as held, so the drain times out naming it."""
    pool = slow_pool
    drained, other = pool
    with other.client() as filler:
        filler.attach("f0")
        filler.attach("f1")  # every row of the other daemon
        with connect_pool([d.name for d in pool], timeout=30) as client:
            client.attach("a", {"prompt": "forest"})
            assert client.home["a"] == drained.name
            drain = rte_drain(drained.name, "--timeout", "6")
            limit = Deadline(40, "rte drain")
            notices: list[Notice] = []
            while drain.poll() is None:
                limit.check()
                if summary(drained.name)["draining_s"] is not None:  # (what rte inspect shows)
                    assert summary(drained.name)["held"] == 1
                notices += client.notices()  # (its moves are tried here, and at poll)
                chunk = client.poll(timeout=0.05)
                if chunk is not None:
                    chunk.release()
                while (chunk := filler.poll(timeout=0.0)) is not None:
                    chunk.release()
            said, err = drain.communicate()
            assert client.home["a"] == drained.name and client.sessions == {"a"}
    assert any("could not move" in n.message for n in notices), notices
    assert drain.returncode == 1, (said, err)
    assert "drained" not in said and "'a' (" in err and len(err.splitlines()) == 1, err


def test_a_drain_of_a_daemon_that_stopped_answering_keeps_its_timeout(
    pool: list[DaemonProcess],
) -> None:
    """A SIGSTOPped daemon never answers DRAIN: the command gives up within its
    --timeout (it waited 5 s more, whatever the timeout), in one line that says
    what to look at."""
    drained = pool[0]
    os.kill(drained.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "rte", "drain", drained.name, "--timeout", "1"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - began
    finally:
        os.kill(drained.pid, signal.SIGCONT)
    assert done.returncode == 1, done
    assert "did not answer" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert "heartbeat" in done.stderr, done.stderr
    assert took < 4.5, f"rte drain --timeout 1 took {took:.1f} s"  # (Python starts in ~1)


def test_a_daemon_frozen_during_the_drain_still_gets_a_count_not_a_bare_timeout(
    pool: list[DaemonProcess],
) -> None:
    """The daemon answered, then froze while sessions were still on it: at the
    timeout the command could not ask for their names, and said only "did not
    answer". It says how many sessions stay (from the control block), in one
    line, and keeps its timeout."""
    drained = pool[0]
    with drained.client() as plain:
        plain.attach("solo")
        drain = rte_drain(drained.name, "--timeout", "3")
        limit = Deadline(what="the daemon's drain")
        while summary(drained.name).get("draining_s") is None:
            limit.check()
            chunk = plain.poll(timeout=0.05)
            if chunk is not None:
                chunk.release()
        os.kill(drained.pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            said, err = drain.communicate(timeout=60)
            took = time.monotonic() - began
        finally:
            os.kill(drained.pid, signal.SIGCONT)
    assert drain.returncode == 1, (said, err)
    assert "1 session still there" in err and len(err.splitlines()) == 1, err
    assert took < 5.5, f"rte drain --timeout 3 took {took:.1f} s more once frozen"


@pytest.mark.parametrize(("code", "session", "handle"), [(0, b"abc", 0), (7, b"", 0), (0, b"", 9)])
def test_a_garbled_drain_record_is_refused_and_drains_nothing(
    pool: list[DaemonProcess], code: int, session: bytes, handle: int
) -> None:
    """A DRAIN drains a daemon for good: a record of type 9 that carries a session
    id, a code or a handle (a garbled one, another record's type byte flipped)
    is refused with an ERROR to its sender, and the daemon goes on taking
    sessions."""
    drained = pool[0]
    raw = RawClient(drained.name)
    try:
        raw.inbox.push(HEADER.pack(RecordType.DRAIN, code, len(session), 41, handle) + session, 5)
        raw.bell.ring()
        got: list[Notice] = []

        def answered() -> bool:
            replies = map(decode_reply, raw.outbox.pop_batch_nowait())
            got.extend(r for r in replies if isinstance(r, Notice))
            return bool(got)

        wait_for(answered, what="the answer to a garbled DRAIN")
    finally:
        raw.close()
    (answer,) = got
    assert answer.kind is NoticeKind.ERROR and answer.seq == 41, answer
    assert "DRAIN" in answer.message, answer.message
    assert summary(drained.name)["draining_s"] is None
    with drained.client() as client:
        client.attach("after")  # not draining: taken


def test_a_suspended_session_moved_by_a_drain_stays_suspended(
    pool: list[DaemonProcess],
) -> None:
    """A session its client suspended is moved by the drain like any other (its
    state is parked in the daemon), and must arrive suspended: no chunk until
    its client resumes it, and the resume is taken there. (Before 204d2af it
    arrived running and its resume was refused: "it is not suspended".)"""
    drained, other = pool
    with connect_pool([d.name for d in pool], timeout=30) as client:
        client.attach("s", {"prompt": "forest"})
        if client.home["s"] != drained.name:
            client.migrate("s", to=drained.name)
        client.suspend("s")
        drain = rte_drain(drained.name, "--timeout", "15")
        limit = Deadline(40, "rte drain")
        while drain.poll() is None:
            limit.check()
            client.notices()
            chunk = client.poll(timeout=0.05)
            if chunk is not None:
                chunk.release()
        _, err = drain.communicate()
        assert drain.returncode == 0, err
        assert client.home["s"] == other.name
        came = []
        end = time.monotonic() + 1.0  # 30 periods: a running session makes chunks
        while time.monotonic() < end:
            chunk = client.poll(timeout=0.05)
            if chunk is not None:
                came.append(chunk.chunk)
                chunk.release()
        assert not came, f"the suspended session made chunks {came} after its move"
        try:
            client.resume("s")
        except RequestError as exc:
            pytest.fail(f"its client's suspend was lost in the move: {exc}")
