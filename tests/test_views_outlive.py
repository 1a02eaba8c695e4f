"""A view of shared memory held past its mapping's end is still readable, never a
crash (issue 20, item 1): after the segment's close, the client's close, the
daemon's death, and a pool's loss of the daemon it came from.

Each case runs in a child process (real daemons, real kills), so a SIGSEGV is
the child's exit code (-11) and the test says so instead of dying with it.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import views_workers
from daemon_harness import DaemonProcess, serving

from shm import shm_name

SPAWN = multiprocessing.get_context("spawn")
WAIT_S = 60.0


class Child:
    """A spawned child running ``target(*args, conn)``; its pipe end is ``conn``."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        self.conn, theirs = SPAWN.Pipe()
        self.process = SPAWN.Process(target=target, args=(*args, theirs), daemon=True)
        self.process.start()
        theirs.close()

    def recv(self) -> Any:
        """The child's next message; if it died first, say how."""
        if not self.conn.poll(WAIT_S):
            self.process.join(1)
            raise AssertionError(f"the child said nothing in {WAIT_S}s (exit {self.exit()})")
        try:
            return self.conn.recv()
        except EOFError:
            raise AssertionError(f"the child died before answering: {self.exit()}") from None

    def exit(self) -> str:
        self.process.join(WAIT_S)
        code = self.process.exitcode
        if code is None:
            self.process.kill()
            self.process.join(10)
            return "still running (killed)"
        return "SIGSEGV" if code == -11 else f"exit code {code}"

    def finished(self) -> None:
        assert self.exit() == "exit code 0"


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    with serving(DaemonProcess(f"{shm_prefix}v", "--model", "null")) as [started]:
        yield started


@pytest.fixture
def pool(shm_prefix: str) -> Iterator[list[DaemonProcess]]:
    args = ("--model", "null", "--max-sessions", "1")
    with serving(*(DaemonProcess(f"{shm_prefix}vp-{i}", *args) for i in range(2))) as started:
        yield started


@pytest.mark.parametrize("form", ["batch", "slot"])
def test_slab_views_stay_readable_after_their_segment_is_closed(shm_prefix: str, form: str) -> None:
    child = Child(views_workers.slab_views_outlive_close, shm_name(shm_prefix, "vs"), form)
    seen, refused = child.recv()
    child.finished()
    assert seen == [sum(range(2048))] * 2
    assert all("closed in this process" in r for r in refused), refused


def test_a_chunk_held_past_the_clients_close_stays_readable(daemon: DaemonProcess) -> None:
    daemon.client().close()  # up
    child = Child(views_workers.chunk_outlives_close, daemon.name)
    before, after = child.recv()
    child.finished()
    assert after == before


def test_a_chunk_held_past_its_daemons_death_stays_readable(daemon: DaemonProcess) -> None:
    daemon.client().close()  # up
    child = Child(views_workers.chunk_outlives_its_daemon, daemon.name)
    assert child.recv() == "holding"
    daemon.kill()
    child.conn.send("killed")
    before, after, gone = child.recv()
    child.finished()
    assert after == before
    assert "died" in gone or "stopping" in gone, gone


def test_a_chunk_held_from_a_lost_pool_member_stays_readable(pool: list[DaemonProcess]) -> None:
    for d in pool:
        d.client().close()  # both up
    child = Child(views_workers.chunk_outlives_a_lost_pool_member, [d.name for d in pool])
    homes = child.recv()
    doomed = next(d for d in pool if d.name == homes["b"])
    doomed.kill()
    child.conn.send("killed")
    before, after, lost = child.recv()
    child.finished()
    assert after == before
    assert doomed.name in lost, lost


def test_a_ring_refuses_every_call_once_its_segment_is_closed(shm_prefix: str) -> None:
    child = Child(views_workers.ring_calls_after_close, shm_name(shm_prefix, "vr"))
    refused = child.recv()
    child.finished()
    assert all("closed in this process" in r for r in refused), refused
