"""Segment: creation, permissions, versioned header, foreign files, space, liveness;
the C status codes and their one mapping to exceptions; names and their clean-up."""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import struct
import threading
import time

import numpy as np
import posix_ipc
import pytest
import shm_workers

from shm import (
    Doorbell,
    ForeignSegmentError,
    ForeignSlot,
    QuotaExceeded,
    RecordTooLarge,
    RingCorrupt,
    RingEmpty,
    RingFull,
    Segment,
    SegmentError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSpaceError,
    SegmentVersionError,
    ShmError,
    SlabFull,
    StaleSlot,
    check_rc,
    shm_name,
)
from shm.backing import free_bytes
from shm.names import SHM_DIR, objects, unlink_objects, unlink_segment
from shm.native import ffi, lib
from shm.segment import HEADER_SIZE

# every error status of enum shm_status and the class check_rc must raise for it
RAISES: dict[str, type[Exception]] = {
    "SHM_RING_FULL": RingFull,
    "SHM_RING_EMPTY": RingEmpty,
    "SHM_RING_TOO_LARGE": RecordTooLarge,
    "SHM_RING_CORRUPT": RingCorrupt,
    "SHM_RING_SHORT_BUFFER": ValueError,
    "SHM_SLAB_FULL": SlabFull,
    "SHM_SLAB_QUOTA": QuotaExceeded,
    "SHM_SLAB_FOREIGN": ForeignSlot,
    "SHM_SLAB_RANGE": ValueError,
    "SHM_SLAB_STALE": StaleSlot,
    "SHM_LAYOUT_MISSING": SegmentError,
    "SHM_LAYOUT_DAMAGED": SegmentError,
    "SHM_LAYOUT_TOO_BIG": SegmentError,
    "SHM_BAD_ARGUMENT": ValueError,
}


def _path(name: str) -> str:
    return "/dev/shm/" + name.lstrip("/")


def test_compiled_module_imports() -> None:
    from shm._native import ffi, lib  # noqa: PLC0415

    word = ffi.new("uint64_t *", 5)
    assert lib.shm_cas(word, 5, 7) == 1
    assert lib.shm_cas(word, 5, 9) == 0
    assert lib.shm_fetch_add(word, 3) == 7
    assert lib.shm_load_acquire(word) == 10
    assert lib.shm_ring_header_size() == 512


def test_check_rc_maps_every_c_status_to_its_class() -> None:
    statuses = ffi.typeof("enum shm_status").relements  # read from the cdef header
    errors = {name: code for name, code in statuses.items() if code < 0}
    assert set(errors) == set(RAISES)  # a new code needs its class here and in check_rc
    assert len(set(errors.values())) == len(errors)  # one meaning per value
    for name, code in errors.items():
        assert getattr(lib, name) == code
        with pytest.raises(RAISES[name]) as caught:
            check_rc(code, "doing this to that")
        assert type(caught.value) is RAISES[name], name
        assert str(caught.value).startswith("doing this to that: "), name
    assert check_rc(lib.SHM_OK, "x") == 0
    assert check_rc(lib.SHM_WAKE, "x") == 1
    assert check_rc(4096, "a count") == 4096
    with pytest.raises(ShmError, match="unknown status -99"):
        check_rc(-99, "x")


def test_objects_and_unlink_objects_take_segments_and_semaphores_under_a_prefix(
    shm_prefix: str,
) -> None:
    root = shm_name(shm_prefix)
    seg = Segment.create(shm_name(shm_prefix, "a", "seg"), HEADER_SIZE)
    bell = Doorbell(shm_name(shm_prefix, "a", "bell"), create=True)
    beside = Segment.create(shm_name(shm_prefix + "b", "seg"), HEADER_SIZE)  # not under "a."
    assert (SHM_DIR / ("sem." + bell.name[1:])).exists()  # semaphores live as sem.<name>
    assert objects(root + ".a.") == sorted([seg.name, bell.name])
    assert objects(root) == sorted([seg.name, bell.name, beside.name])
    assert objects(root + ".nothing") == []
    assert unlink_objects(root + ".a.") == sorted([seg.name, bell.name])
    assert objects(root) == [beside.name]
    with pytest.raises(SegmentNotFoundError):
        Segment.open(seg.name)
    with pytest.raises(SegmentNotFoundError):
        Doorbell(bell.name)
    bell.ring()  # handles opened before the unlink stay valid
    assert bell.wait(0)
    assert unlink_objects(root + ".a.") == []  # gone already: nothing to do, no error
    assert unlink_objects(root) == [beside.name]
    with pytest.raises(ValueError, match="POSIX name"):
        objects("rte.no.slash")
    for handle in (seg, bell, beside):
        handle.close()


def test_create_open_round_trip_mode_0600_and_fully_backed(shm_prefix: str) -> None:
    name = shm_name(shm_prefix, "seg")
    seg = Segment.create(name, 3 * HEADER_SIZE, kind=7)
    st = os.stat(_path(name))
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_blocks * 512 >= 3 * HEADER_SIZE  # backed now, not on first touch
    other = Segment.open(name, kind=7)
    assert (other.size, other.kind, other.creator_pid) == (3 * HEADER_SIZE, 7, os.getpid())
    assert other.creator_alive()
    a = seg.array(HEADER_SIZE, np.uint32, (4,), readonly=False)
    a[:] = [1, 2, 3, 4]
    assert list(other.array(HEADER_SIZE, np.uint32, (4,), readonly=True)) == [1, 2, 3, 4]
    with pytest.raises(ForeignSegmentError, match="kind 7, expected 8"):
        Segment.open(name, kind=8)
    with pytest.raises(SegmentExistsError):
        Segment.create(name, HEADER_SIZE)
    other.close()
    seg.close()
    seg.unlink()
    with pytest.raises(SegmentNotFoundError):
        Segment.open(name)


def test_foreign_and_old_version_segments_are_refused(shm_prefix: str) -> None:
    garbage = shm_name(shm_prefix, "garbage")
    raw = posix_ipc.SharedMemory(garbage, posix_ipc.O_CREX, size=HEADER_SIZE * 2)
    os.pwrite(raw.fd, b"not ours" * 64, 0)
    raw.close_fd()
    with pytest.raises(ForeignSegmentError, match="not an rte segment"):
        Segment.open(garbage)
    tiny = shm_name(shm_prefix, "tiny")
    posix_ipc.SharedMemory(tiny, posix_ipc.O_CREX, size=100).close_fd()
    with pytest.raises(ForeignSegmentError, match="smaller than a header"):
        Segment.open(tiny)

    old = shm_name(shm_prefix, "old")
    seg = Segment.create(old, HEADER_SIZE)
    seg.bytes_at(8, 4)[:] = struct.pack("<I", 99)
    with pytest.raises(SegmentVersionError, match="layout version 99"):
        Segment.open(old)
    seg.close()
    for name in (garbage, tiny, old):  # what a test makes, it removes
        unlink_segment(name)


def test_too_small_dev_shm_is_a_clear_error_and_leaves_nothing(shm_prefix: str) -> None:
    free = free_bytes()
    assert free is not None
    name = shm_name(shm_prefix, "huge")
    with pytest.raises(SegmentSpaceError, match=r"needs [\d,]+ bytes .* free"):
        Segment.create(name, free + (1 << 30))
    assert not os.path.exists(_path(name))


def test_creator_liveness_uses_pid_and_start_time(shm_prefix: str) -> None:
    name = shm_name(shm_prefix, "orphan")
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=shm_workers.create_and_exit, args=(name,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    seg = Segment.open(name)
    assert seg.creator_pid == child.pid
    assert not seg.creator_alive()
    seg.close()
    seg.unlink()


def test_close_with_a_view_still_held_is_safe(shm_prefix: str) -> None:
    seg = Segment.create(shm_name(shm_prefix, "held"), 2 * HEADER_SIZE)
    view = seg.array(HEADER_SIZE, np.uint8, (8,), readonly=False)
    view[:] = 9
    seg.close()
    assert view.sum() == 72  # still mapped: the view keeps the mapping alive
    seg.close()  # idempotent
    seg.unlink()


def test_bad_names_are_refused() -> None:
    with pytest.raises(ValueError, match="name part"):
        shm_name("no/slashes")


def test_a_signal_to_a_thread_asleep_on_a_doorbell_is_a_wake_up_not_an_error(
    shm_prefix: str,
) -> None:
    """A signal delivered to the thread asleep in ``wait`` (any thread may get
    a process's SIGTERM) made posix_ipc raise SignalError, which ended a
    daemon's serve loop; now it is a wake-up without a ring, and the caller
    looks again."""
    bell = Doorbell(shm_name(shm_prefix, "sig", "bell"), create=True)
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    outcome: list[object] = []
    asleep = threading.Event()

    def sleeper() -> None:
        asleep.set()
        try:
            outcome.append(bell.wait(30.0))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=sleeper)
    try:
        thread.start()
        assert asleep.wait(10)
        started = time.monotonic()
        while thread.is_alive() and time.monotonic() - started < 10:
            assert thread.ident is not None
            signal.pthread_kill(thread.ident, signal.SIGUSR1)  # until it is out of the wait
            thread.join(0.05)
        assert outcome == [False]
    finally:
        bell.ring()  # whatever happened, the sleeper ends
        thread.join(10)
        signal.signal(signal.SIGUSR1, previous)
        bell.close()
        bell.unlink()
