"""pid plus start time names one process, whatever the wall clock does meanwhile.

A daemon tells a dead client from a live one, and a client a dead daemon, by
the pid and start time each wrote where the other reads it
(:func:`shm.is_alive`). psutil's ``create_time`` is the kernel's ticks since
boot plus the boot time as ``/proc/stat`` gives it at the call, which is the
wall clock minus the uptime: a clock slew moves it by a second now and then.
A CI run saw it: a client raised EngineGone ("died") on a daemon that was
running, and stopped with exit 0 after the test. Each test here makes
``/proc/stat``'s boot time read one second later, as such a slew does, once
the start times are written.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable

import psutil
import pytest
from daemon_harness import DaemonProcess

from shm import Segment, is_alive
from shm.names import shm_name
from shm.segment import process_start_time

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the kernel's count since boot is Linux's"
)


@pytest.fixture
def slew(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Makes ``/proc/stat``'s boot time, as psutil reads it, one second later."""
    from psutil import _pslinux  # noqa: PLC0415

    before = _pslinux.boot_time()
    return lambda: monkeypatch.setattr(_pslinux, "boot_time", lambda: before + 1.0)


def test_a_live_process_stays_alive_when_the_boot_time_moves(slew: Callable[[], None]) -> None:
    child = multiprocessing.get_context("spawn").Process(target=_sleep)
    me = os.getpid()
    mine = process_start_time(me)
    child.start()
    try:
        assert child.pid is not None
        theirs = process_start_time(child.pid)
        assert mine is not None and theirs is not None and theirs > mine
        slew()
        assert is_alive(me, mine) and is_alive(child.pid, theirs)
        assert not is_alive(child.pid, mine)  # the same pid with another start: not it
    finally:
        child.kill()
        child.join(10)
    assert process_start_time(child.pid) is None and not is_alive(child.pid, theirs)


def _sleep() -> None:
    import time  # noqa: PLC0415

    time.sleep(60)


def test_a_segments_creator_is_named_by_the_same_count(
    shm_prefix: str, slew: Callable[[], None]
) -> None:
    segment = Segment.create(shm_name(shm_prefix, "who"), 4096)
    try:
        assert segment.creator_pid == os.getpid()
        assert segment.creator_start == process_start_time(os.getpid())
        slew()
        assert segment.creator_alive()
    finally:
        segment.close()
        segment.unlink()


def test_a_client_does_not_take_a_live_daemon_for_dead_after_a_slew(
    shm_prefix: str, slew: Callable[[], None]
) -> None:
    daemon = DaemonProcess(f"{shm_prefix}slew", "--model", "null")
    try:
        with daemon.client() as client:
            slew()  # after the daemon wrote its start and this client read it
            for _ in range(3):  # waits that look at the daemon's pid and start time
                assert client.poll(timeout=0.4) is None
            client.attach("a")
            assert client.poll(timeout=10) is not None
        assert psutil.Process(daemon.pid).is_running()
    finally:
        assert daemon.stop() == 0, daemon.stderr
