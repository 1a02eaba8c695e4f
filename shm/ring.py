"""Ring: a lock-free single-producer single-consumer ring of byte records.

The records live in a segment, so producer and consumer may be different
processes; exactly one of each may use a ring at a time. Push and pop are one
C call each (``csrc/shm_native.c`` holds the layout and the memory ordering);
``pop_batch`` drains everything available in one call.

Waiting is a policy (:class:`WaitPolicy`): ``spin`` polls and yields,
``block`` sleeps on the ring's :class:`~shm.doorbell.Doorbell` at once, and
``spin-then-block`` (the default) polls for ``spin_us`` microseconds first.
A producer facing a full ring backs off with short sleeps up to its timeout,
then raises :class:`~shm.errors.RingFull`: backpressure, never growth.

Blocking calls accept ``check``, called about every 100 ms while waiting, so a
caller can notice a dead peer and raise instead of waiting out the timeout.
Without ``check`` a blocked consumer sleeps on its doorbell for the whole
timeout: only a push wakes it (the lost-wake-up test relies on that).
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shm.doorbell import Doorbell
from shm.errors import RecordTooLarge, RingCorrupt, RingEmpty, RingFull, SegmentError
from shm.native import ffi, lib
from shm.segment import Segment

HEADER = int(lib.shm_ring_header_size())
CHECK_EVERY_S = 0.1
SPIN_SLICE_NS = 1_000_000  # the spin policy polls in slices this long, yielding between


class WaitPolicy(enum.Enum):
    SPIN = "spin"
    SPIN_THEN_BLOCK = "spin-then-block"
    BLOCK = "block"


@dataclass(frozen=True)
class RingStatistics:
    """Counters read from the ring's header in shared memory (a live snapshot)."""

    capacity: int
    used_bytes: int
    high_water_bytes: int
    pushed: int
    popped: int
    bytes_pushed: int
    bytes_popped: int
    full_events: int
    oversized: int
    corrupt: int
    wakeups: int
    consumer_sleeping: bool

    @property
    def waiting(self) -> int:
        """Records pushed and not yet popped."""
        return self.pushed - self.popped


class Ring:
    """One ring in ``segment`` at ``offset`` (made by :meth:`create`)."""

    def __init__(
        self,
        segment: Segment,
        offset: int,
        *,
        doorbell: Doorbell | None = None,
        policy: WaitPolicy | str = WaitPolicy.SPIN_THEN_BLOCK,
        spin_us: float = 50.0,
    ) -> None:
        self.segment = segment
        self.offset = offset
        self._ptr = segment.ptr(offset)
        capacity = int(lib.shm_ring_check(self._ptr, segment.size - offset))
        if capacity < 0:
            reason = {-1: "no ring there", -2: "a damaged ring header", -3: "a ring too big"}
            raise SegmentError(
                f"{segment.name} at offset {offset} holds {reason.get(capacity, 'no ring')}"
            )
        self.capacity = capacity
        self.max_record = int(lib.shm_ring_max_payload(capacity))
        self.policy = WaitPolicy(policy)
        if self.policy is not WaitPolicy.SPIN and doorbell is None:
            raise ValueError(f"wait policy {self.policy.value!r} needs a doorbell")
        self.doorbell = doorbell
        self._spin_ns = int(spin_us * 1000)
        self._out: Any = None  # the consumer's copy-out buffer, made on first pop
        self._lens: Any = None

    @staticmethod
    def footprint(capacity: int) -> int:
        """Bytes a ring of ``capacity`` occupies (header included)."""
        return HEADER + capacity

    @classmethod
    def create(cls, segment: Segment, offset: int, capacity: int, **kwargs: Any) -> Ring:
        """Lay out a new, empty ring; ``capacity`` is a power of two, at least 64."""
        if offset % 128 or offset + cls.footprint(capacity) > segment.size:
            raise ValueError(f"ring at {offset} (+{cls.footprint(capacity)}) does not fit")
        if lib.shm_ring_init(segment.ptr(offset), capacity) != 0:
            raise ValueError(f"ring capacity must be a power of two >= 64, got {capacity}")
        return cls(segment, offset, **kwargs)

    # -- producer ---------------------------------------------------------

    def push_nowait(self, record: bytes | bytearray | memoryview) -> None:
        """Append one record, or raise RingFull / RecordTooLarge at once."""
        data = record if type(record) is bytes else ffi.from_buffer(record)
        rc = lib.shm_ring_push(self._ptr, data, len(record), 1)
        if rc:
            self._pushed(rc, record)

    def push(
        self,
        record: bytes | bytearray | memoryview,
        timeout: float,
        check: Callable[[], None] | None = None,
    ) -> None:
        """Append one record, waiting up to ``timeout`` s for room; then RingFull."""
        data = record if type(record) is bytes else ffi.from_buffer(record)
        rc = lib.shm_ring_push(self._ptr, data, len(record), 1)
        if rc != -1:
            if rc:
                self._pushed(rc, record)
            return
        start = time.monotonic()
        deadline, next_check, pause = start + timeout, start + CHECK_EVERY_S, 20e-6
        while True:
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
            rc = lib.shm_ring_push(self._ptr, data, len(record), 0)
            if rc != -1:
                self._pushed(rc, record)
                return
            now = time.monotonic()
            if check is not None and now >= next_check:
                check()
                next_check = now + CHECK_EVERY_S
            if now >= deadline:
                raise RingFull(
                    f"ring in {self.segment.name} stayed full for {now - start:.3f}s: "
                    "its consumer is not keeping up"
                )

    def _pushed(self, rc: int, record: bytes | bytearray | memoryview) -> None:
        if rc == 1 and self.doorbell is not None:
            self.doorbell.ring()
        elif rc == -1:
            raise RingFull(f"ring in {self.segment.name} is full ({self.capacity} bytes)")
        elif rc == -2:
            raise RecordTooLarge(
                f"record of {len(record):,} bytes exceeds this ring's largest, "
                f"{self.max_record:,} (half its capacity); use a slab slot for bulk data"
            )

    # -- consumer ---------------------------------------------------------

    def _buffers(self) -> Any:
        if self._out is None:
            self._out = ffi.new("char[]", self.capacity)
            self._lens = ffi.new("uint64_t[]", self.capacity // 8)
        return self._out

    def pop_nowait(self) -> bytes:
        """Take the oldest record, or raise RingEmpty at once."""
        out = self._out if self._out is not None else self._buffers()
        n = lib.shm_ring_pop(self._ptr, out, self.capacity)
        if n >= 0:
            return ffi.unpack(out, n)  # type: ignore[no-any-return]
        if n == -1:
            raise RingEmpty(f"ring in {self.segment.name} is empty")
        raise RingCorrupt(f"ring in {self.segment.name} at {self.offset} holds invalid bytes")

    def pop(self, timeout: float, check: Callable[[], None] | None = None) -> bytes:
        """Take the oldest record, waiting up to ``timeout`` s; then RingEmpty."""
        out = self._out if self._out is not None else self._buffers()
        # The spin phase polls in C (GIL released) and takes the record the
        # moment it lands; only an empty ring after it pays the slower wait.
        n = lib.shm_ring_pop_spin(self._ptr, out, self.capacity, self._first_spin_ns(timeout))
        if n >= 0:
            return ffi.unpack(out, n)  # type: ignore[no-any-return]
        if n == -1 and not self.wait_readable(timeout, check):
            raise RingEmpty(f"ring in {self.segment.name} stayed empty for {timeout}s")
        return self.pop_nowait()

    def _first_spin_ns(self, timeout: float) -> int:
        if self.policy is WaitPolicy.BLOCK:
            return 0
        if self.policy is WaitPolicy.SPIN:
            return min(int(timeout * 1e9), SPIN_SLICE_NS)
        return min(int(timeout * 1e9), self._spin_ns)

    def pop_batch_nowait(self, max_records: int | None = None) -> list[bytes]:
        """Take every record available now (at most ``max_records``); [] when empty."""
        out = self._buffers()
        limit = self.capacity // 8 if max_records is None else min(max_records, self.capacity // 8)
        n = int(lib.shm_ring_pop_batch(self._ptr, out, self.capacity, self._lens, limit))
        if n < 0:
            raise RingCorrupt(f"ring in {self.segment.name} at {self.offset} holds invalid bytes")
        records, at = [], 0
        for i in range(n):
            size = int(self._lens[i])
            records.append(ffi.unpack(out + at, size))
            at += size
        return records

    def pop_batch(self, timeout: float, check: Callable[[], None] | None = None) -> list[bytes]:
        """Wait up to ``timeout`` s for a record, then take all available; [] on timeout."""
        if not self.wait_readable(timeout, check):
            return []
        return self.pop_batch_nowait()

    def wait_readable(self, timeout: float, check: Callable[[], None] | None = None) -> bool:
        """Wait by the ring's policy until a record is available; False after ``timeout``."""
        ptr = self._ptr
        if lib.shm_ring_used(ptr):
            return True
        start = time.monotonic_ns()
        deadline = start + int(timeout * 1e9)
        spin_until = start + (self._spin_ns if self.policy is WaitPolicy.SPIN_THEN_BLOCK else 0)
        spinning = self.policy is WaitPolicy.SPIN
        next_check = start + int(CHECK_EVERY_S * 1e9)
        now = start
        while True:
            if spinning or now < spin_until:
                limit = deadline if spinning else spin_until
                if lib.shm_ring_wait_used(ptr, max(0, min(limit - now, SPIN_SLICE_NS))):
                    return True
                if spinning:
                    os.sched_yield()  # between slices, let a peer on this core run
            elif self._sleep((min(deadline, next_check) if check else deadline) - now):
                return True
            now = time.monotonic_ns()
            if check is not None and now >= next_check:
                check()
                next_check = now + int(CHECK_EVERY_S * 1e9)
            if now >= deadline:
                return bool(lib.shm_ring_used(ptr))

    def used(self) -> int:
        """Bytes pushed and not yet popped (records, padding and wrap skips)."""
        return int(lib.shm_ring_used(self._ptr))

    def prepare_sleep(self) -> bool:
        """Announce that the consumer will sleep on the doorbell. True when records
        arrived meanwhile (then do not sleep); otherwise call :meth:`end_sleep` on
        waking. For a consumer that sleeps on one doorbell for many rings."""
        return bool(lib.shm_ring_prepare_sleep(self._ptr))

    def end_sleep(self) -> None:
        lib.shm_ring_end_sleep(self._ptr)

    def wake(self) -> bool:
        """Ring the doorbell if the consumer sleeps: for producers of something
        other than records (freed slab slots, say) that the consumer re-checks
        after announcing its sleep. True when it rang."""
        if lib.shm_ring_wake(self._ptr) and self.doorbell is not None:
            self.doorbell.ring()
            return True
        return False

    def _sleep(self, budget_ns: int) -> bool:
        """Announce sleep, re-check, sleep on the doorbell. True when records are there."""
        assert self.doorbell is not None
        if lib.shm_ring_prepare_sleep(self._ptr):
            return True
        try:
            self.doorbell.wait(max(budget_ns, 0) / 1e9)
        finally:
            lib.shm_ring_end_sleep(self._ptr)
        return bool(lib.shm_ring_used(self._ptr))

    # -- either side ------------------------------------------------------

    def peek(self, index: int) -> bytes | None:
        """The record ``index`` places behind the oldest, without consuming; None if absent.

        For inspectors: safe on a live ring (bounds-checked), but a snapshot only.
        """
        buffer = bytearray(self.max_record)
        n = int(lib.shm_ring_peek(self._ptr, index, ffi.from_buffer(buffer), len(buffer)))
        return bytes(buffer[:n]) if n >= 0 else None

    def reset(self) -> None:
        """Drop every record. Only when neither peer is running (one died, say)."""
        lib.shm_ring_reset(self._ptr)

    def statistics(self) -> RingStatistics:
        out = ffi.new("uint64_t[13]")
        lib.shm_ring_stats(self._ptr, out)
        v = [int(x) for x in out]  # order: see shm_ring_stats in csrc/shm_native.c
        return RingStatistics(
            capacity=v[0],
            used_bytes=v[1] - v[2],
            pushed=v[3],
            popped=v[4],
            bytes_pushed=v[5],
            bytes_popped=v[6],
            full_events=v[7],
            high_water_bytes=v[8],
            oversized=v[9],
            corrupt=v[10],
            wakeups=v[11],
            consumer_sleeping=bool(v[12]),
        )


def wait_any(
    rings: list[Ring],
    doorbell: Doorbell,
    timeout: float,
    ready: Callable[[], bool] | None = None,
) -> bool:
    """Sleep until any of ``rings`` holds a record, or ``timeout`` s pass.

    Every ring's producer must ring this ``doorbell``. ``ready`` is any other
    condition to wake for; it is checked after the sleep is announced, and its
    producers must call :meth:`Ring.wake` after making it true. True when woken
    or already ready; False on timeout.
    """
    prepared: list[Ring] = []
    try:
        for ring in rings:
            if ring.prepare_sleep():
                return True
            prepared.append(ring)
        if ready is not None and ready():
            return True
        return doorbell.wait(timeout)
    finally:
        for ring in prepared:
            ring.end_sleep()
