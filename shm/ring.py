"""Ring: a lock-free single-producer single-consumer ring of byte records.

The records live in a segment, so producer and consumer may be different
processes; exactly one of each may use a ring at a time. Push and pop are one
C call each (``csrc/shm_native.c`` holds the layout and the memory ordering);
``pop_batch`` drains everything available in one call.

How a consumer waits for records (the policies, the sleep handshake with the
producer, many rings on one doorbell) is :mod:`shm.waiting`; this module is the
records. A producer facing a full ring backs off with short sleeps up to its
timeout, then raises :class:`~shm.errors.RingFull`: backpressure, never growth.
Blocking calls accept ``check``, called about every 100 ms while waiting, so a
caller can notice a dead peer and raise instead of waiting out the timeout.

The C calls return ``enum shm_status`` codes (``csrc/shm_native.h``). The hot
paths compare them with module constants read once from ``lib``; only an error
goes through :func:`~shm.errors.check_rc`, which raises its exception. Once
its segment is closed in this process a ring refuses every call
(:class:`~shm.errors.SegmentError`) instead of reaching unmapped memory.

A peer maps the ring writable, header included: so its geometry is read once,
at open, into a process-local ``shm_ring_t``, and every record must lie whole
inside the ring before a byte is copied. A scribbling peer garbles its own
records (:class:`~shm.errors.RingCorrupt`), never makes us touch a byte outside.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from shm.doorbell import Bell
from shm.errors import LayoutError, RingEmpty, RingFull, SegmentError, check_rc
from shm.native import ffi, lib
from shm.ring_stats import RingStatistics
from shm.segment import Segment
from shm.waiting import (
    CHECK_EVERY_S,
    SPIN_SLICE_NS,
    AdaptiveSpin,
    WaitPolicy,
    WaitTally,
    pop_spin_ns,
    wait_any,
    wait_used,
)

__all__ = [
    "CHECK_EVERY_S",
    "HEADER",
    "SPIN_SLICE_NS",
    "Ring",
    "RingStatistics",
    "WaitPolicy",
    "max_record",
    "wait_any",
]

HEADER = int(lib.shm_ring_header_size())

# the statuses the hot paths test for, read once (a global is cheaper than lib.X)
_WAKE = int(lib.SHM_WAKE)
_FULL = int(lib.SHM_RING_FULL)
_EMPTY = int(lib.SHM_RING_EMPTY)
_CORRUPT = int(lib.SHM_RING_CORRUPT)


def max_record(capacity: int) -> int:
    """The largest record a ring of ``capacity`` bytes carries."""
    return int(lib.shm_ring_max_payload(capacity))


class Ring:
    """One ring in ``segment`` at ``offset`` (made by :meth:`create`)."""

    def __init__(
        self,
        segment: Segment,
        offset: int,
        *,
        doorbell: Bell | None = None,
        policy: WaitPolicy | str = WaitPolicy.SPIN_THEN_BLOCK,
        spin_us: float = 50.0,
        expected: int | None = None,
    ) -> None:
        """``expected``: the capacity the caller's layout gives it (else LayoutError)."""
        self.segment = segment
        self.offset = offset
        # the ring as opened here: the C reads its geometry from this, never the header
        self._raw = ffi.new("shm_ring_t *")
        capacity = check_rc(
            int(lib.shm_ring_open(self._raw, segment.ptr(offset), segment.size - offset)),
            f"opening the ring at offset {offset} of {segment.name}",
        )
        if expected is not None and capacity != expected:
            where = f"the ring at offset {offset} of {segment.name}"
            raise LayoutError(f"{where} says {capacity} bytes, its layout {expected}: garbled")
        self.capacity = capacity
        self.max_record = max_record(capacity)
        self.policy = WaitPolicy(policy)
        if self.policy is not WaitPolicy.SPIN and doorbell is None:
            raise ValueError(f"wait policy {self.policy.value!r} needs a doorbell")
        self.doorbell = doorbell
        self._spin_ns = int(spin_us * 1000)
        # what pop spins before anything slower: per policy, bounded by its timeout
        self._pop_spin_ns = pop_spin_ns(self.policy, self._spin_ns)
        self.tally = WaitTally()  # how the consumer here waited (process-local)
        # spin-then-block spins as long as records recently took to come (>= spin_us)
        self.spin = AdaptiveSpin(self._spin_ns)
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
        check_rc(
            lib.shm_ring_init(segment.ptr(offset), capacity),
            f"creating a ring of capacity {capacity} in {segment.name} "
            "(a ring's capacity must be a power of two >= 64)",
        )
        return cls(segment, offset, expected=capacity, **kwargs)

    # -- producer ---------------------------------------------------------

    def push_nowait(self, record: bytes | bytearray | memoryview) -> None:
        """Append one record, or raise RingFull / RecordTooLarge at once."""
        data = record if type(record) is bytes else ffi.from_buffer(record)
        rc = lib.shm_ring_push(self.handle, data, len(record), 1)
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
        rc = lib.shm_ring_push(self.handle, data, len(record), 1)
        if rc != _FULL:
            if rc:
                self._pushed(rc, record)
            return
        start = time.monotonic()
        deadline, next_check, pause = start + timeout, start + CHECK_EVERY_S, 20e-6
        while True:
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
            rc = lib.shm_ring_push(self.handle, data, len(record), 0)
            if rc != _FULL:
                if rc:
                    self._pushed(rc, record)
                return
            now = time.monotonic()
            if check is not None and now >= next_check:
                check()
                next_check = now + CHECK_EVERY_S
            if now >= deadline:
                raise RingFull(
                    f"{self._where()} stayed full for {now - start:.3f}s: "
                    "its consumer is not keeping up (backpressure)"
                )

    def _pushed(self, rc: int, record: bytes | bytearray | memoryview) -> None:
        """After a push that returned ``rc`` != SHM_OK: wake the consumer, or raise."""
        if rc == _WAKE:
            if self.doorbell is not None:
                self.doorbell.ring()
            return
        check_rc(
            rc,
            f"push of a {len(record):,}-byte record to {self._where()} "
            f"(capacity {self.capacity:,} bytes, largest record {self.max_record:,})",
        )

    def _where(self) -> str:
        return f"the ring at offset {self.offset} of {self.segment.name}"

    @property
    def handle(self) -> Any:
        """The ring's ``shm_ring_t *``, for the C calls (and :mod:`shm.waiting`);
        refused once the segment is closed in this process."""
        if self.segment.closed:
            raise SegmentError(f"{self._where()} is closed in this process; open it again")
        return self._raw

    # -- consumer ---------------------------------------------------------

    def _buffers(self) -> Any:
        if self._out is None:
            self._out = ffi.new("char[]", self.capacity)
            self._lens = ffi.new("uint64_t[]", self.capacity // 8)
        return self._out

    def consumer_buffers(self) -> tuple[Any, Any]:
        """The consumer's copy-out buffer (``char[capacity]``) and record lengths
        (``uint64_t[capacity // 8]``), made on first use: for the pop variants
        elsewhere in ``shm`` (:class:`shm.steps.RowsReader`) that drain the ring
        as :meth:`pop_batch_nowait` does."""
        out = self._buffers()
        return out, self._lens

    def where(self) -> str:
        """Which ring this is, for messages."""
        return self._where()

    def pop_nowait(self) -> bytes:
        """Take the oldest record, or raise RingEmpty at once."""
        out = self._out if self._out is not None else self._buffers()
        n = lib.shm_ring_pop(self.handle, out, self.capacity)
        if n < 0:
            check_rc(n, f"pop from {self._where()}")
        return ffi.unpack(out, n)  # type: ignore[no-any-return]

    def pop(self, timeout: float, check: Callable[[], None] | None = None) -> bytes:
        """Take the oldest record, waiting up to ``timeout`` s; then RingEmpty."""
        out = self._out if self._out is not None else self._buffers()
        # The spin phase polls in C (GIL released) and takes the record the
        # moment it lands; only an empty ring after it pays the slower wait.
        spin = self._pop_spin_ns
        if timeout * 1e9 < spin:
            spin = int(timeout * 1e9)
        n = lib.shm_ring_pop_spin(self.handle, out, self.capacity, spin)
        if n >= 0:
            return ffi.unpack(out, n)  # type: ignore[no-any-return]
        if n == _EMPTY and not self.wait_readable(timeout, check):
            raise RingEmpty(
                f"{self._where()} stayed empty for {timeout}s: its producer sent nothing"
            )
        return self.pop_nowait()

    def pop_batch_nowait(self, max_records: int | None = None) -> list[bytes]:
        """Take every record available now (at most ``max_records``); [] when empty."""
        out = self._buffers()
        limit = self.capacity // 8 if max_records is None else min(max_records, self.capacity // 8)
        n = int(lib.shm_ring_pop_batch(self.handle, out, self.capacity, self._lens, limit))
        if n < 0:
            check_rc(n, f"batch pop from {self._where()}")
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

    def wait_readable(
        self,
        timeout: float,
        check: Callable[[], None] | None = None,
        policy: WaitPolicy | None = None,
    ) -> bool:
        """Wait by the ring's policy (or ``policy``) until a record is available;
        False after ``timeout`` (see :func:`shm.waiting.wait_used`); counted in
        :attr:`tally`. ``spin-then-block`` spins as long as recent waits lasted
        (:attr:`spin`, an :class:`~shm.waiting.AdaptiveSpin` of at least ``spin_us``)."""
        policy = policy or self.policy
        return wait_used(
            self, self.doorbell, timeout, check, policy, self._spin_ns, self.tally, self.spin
        )

    def used(self) -> int:
        """Bytes pushed and not yet popped (records, padding and wrap skips)."""
        return int(lib.shm_ring_used(self.handle))

    def last_push_ns(self) -> int:
        """When the newest record was pushed (``time.monotonic_ns``; 0: none yet)."""
        return int(lib.shm_ring_last_push_ns(self.handle))

    def prepare_sleep(self) -> bool:
        """Announce that the consumer will sleep on the doorbell. True when records
        arrived meanwhile (then do not sleep); otherwise call :meth:`end_sleep` on
        waking. For a consumer that sleeps on one doorbell for many rings."""
        return bool(lib.shm_ring_prepare_sleep(self.handle))

    def end_sleep(self) -> None:
        lib.shm_ring_end_sleep(self.handle)

    def wake(self) -> bool:
        """Ring the doorbell if the consumer sleeps: for producers of something
        other than records (freed slab slots, say) that the consumer re-checks
        after announcing its sleep. True when it rang."""
        if lib.shm_ring_wake(self.handle) and self.doorbell is not None:
            self.doorbell.ring()
            return True
        return False

    # -- either side ------------------------------------------------------

    def peek(self, index: int) -> bytes | None:
        """The record ``index`` places behind the oldest, without consuming; None if absent.

        For inspectors: safe on a live ring (bounds-checked), but a snapshot only,
        so bytes that do not parse as records (a live peer moved meanwhile, or
        real corruption) also read as None.
        """
        buffer = bytearray(self.max_record)
        n = int(lib.shm_ring_peek(self.handle, index, ffi.from_buffer(buffer), len(buffer)))
        if n in (_EMPTY, _CORRUPT):
            return None
        check_rc(n, f"peek at record {index} of {self._where()}")
        return bytes(buffer[:n])

    def reset(self) -> None:
        """Drop every record. Only when neither peer is running (one died, say)."""
        lib.shm_ring_reset(self.handle)

    def wipe(self) -> None:
        """Lay the ring out anew with the geometry it was opened with (its peer is
        gone, and may have garbled it: a reset keeps a garbled head garbled)."""
        check_rc(lib.shm_ring_init(self.handle.header, self.capacity), f"wiping {self._where()}")

    def statistics(self) -> RingStatistics:
        """A snapshot of the ring's counters, read from shared memory."""
        out = ffi.new("shm_ring_stats_t *")
        lib.shm_ring_stats(self.handle, out)
        return RingStatistics.from_c(out)
