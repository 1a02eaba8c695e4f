"""Slab: fixed-size, page-aligned slots in shared memory, written once, read in place.

The writer takes a free slot for an owner (:meth:`Slab.acquire`), writes the
data straight into it through a writable view, and publishes it; it then tells
the reader (slot, generation, dtype, shape) over a ring. The reader gets a
read-only NumPy view of the slot's bytes (:meth:`Slab.view`), no copy, and
releases it when done. Each slot's state word (free / writing / ready) carries a
generation that every release must name, so a stale release is refused instead
of freeing a slot that was reused. Owners have quotas, so a reader that holds
all its slots stalls only itself; :meth:`Slab.reclaim` frees a dead owner's
slots in one call. Counters live in the slab's header, for inspectors.

:meth:`Slab.pin` registers the slots as page-locked memory with CUDA when torch
with CUDA is already imported (device-to-host copies then go straight in,
asynchronously); elsewhere it does nothing, and never imports torch.
"""

from __future__ import annotations

import enum
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

import numpy as np

from shm.errors import (
    ForeignSlot,
    QuotaExceeded,
    SegmentError,
    SlabFull,
    StaleSlot,
)
from shm.native import ffi, lib
from shm.segment import Segment, page_align

# return codes of the C slab calls (shm_native.c: SLAB_*)
_FULL, _QUOTA, _FOREIGN, _RANGE, _STALE = -1, -2, -3, -4, -5


class SlotState(enum.IntEnum):
    FREE = 0
    WRITING = 1
    READY = 2


class Lease(NamedTuple):
    """A slot taken by the writer for ``owner``; name it to publish or abort."""

    slot: int
    generation: int
    owner: int


@dataclass(frozen=True)
class SlotInfo:
    state: SlotState
    generation: int
    owner: int
    since_ns: int  # time.monotonic_ns() when it was acquired


@dataclass(frozen=True)
class SlabStatistics:
    """Counters read from the slab's header in shared memory (a live snapshot)."""

    slots: int
    slot_size: int
    quota: int
    held: int
    high_water: int
    acquired: int
    released: int
    aborted: int
    reclaimed: int
    stale_refused: int
    foreign_refused: int
    quota_refused: int
    full_events: int


class Slab:
    """The slab in ``segment`` at ``offset`` (made by :meth:`create`)."""

    def __init__(self, segment: Segment, offset: int) -> None:
        self.segment = segment
        self.offset = offset
        self._meta = segment.ptr(offset)
        slots = int(lib.shm_slab_check(self._meta, segment.size - offset))
        if slots < 0:
            raise SegmentError(f"{segment.name} at offset {offset} holds no valid slab")
        stats = self._raw_stats()
        self.slots, self.max_owners, self.slot_size, self.quota = stats[:4]
        meta = int(lib.shm_slab_meta_size(self.slots, self.max_owners))
        self.data_offset = page_align(offset + meta)
        if self.data_offset + self.slots * self.slot_size > segment.size:
            raise SegmentError(f"{segment.name}: slab at {offset} runs past the segment")
        self._pinned = False
        self._generation = ffi.new("uint64_t *")  # acquire's out-parameter, reused
        self._views: dict[tuple[Any, tuple[int, ...]], tuple[np.dtype[Any], int]] = {}

    @staticmethod
    def footprint(offset: int, slots: int, slot_bytes: int, max_owners: int) -> int:
        """Bytes from ``offset`` to the end of such a slab (metadata, alignment, slots)."""
        meta = int(lib.shm_slab_meta_size(slots, max_owners))
        return page_align(offset + meta) - offset + slots * page_align(slot_bytes)

    @classmethod
    def create(
        cls,
        segment: Segment,
        offset: int,
        *,
        slots: int,
        slot_bytes: int,
        max_owners: int,
        quota: int = 0,
    ) -> Slab:
        """Lay out ``slots`` free slots of at least ``slot_bytes`` each (page-rounded).

        ``quota`` is the most slots one owner may hold (0: no limit but the slab's).
        """
        if slots < 1 or slot_bytes < 1 or max_owners < 1:
            raise ValueError("a slab needs at least one slot of one byte and one owner")
        if (
            offset % 128
            or offset + cls.footprint(offset, slots, slot_bytes, max_owners) > segment.size
        ):
            raise ValueError(f"slab of {slots} x {slot_bytes} B at {offset} does not fit")
        lib.shm_slab_init(segment.ptr(offset), slots, max_owners, page_align(slot_bytes), quota)
        return cls(segment, offset)

    # -- writer -----------------------------------------------------------

    def acquire(self, owner: int) -> Lease:
        """Take a free slot for ``owner``; SlabFull or QuotaExceeded when none may be had."""
        generation = self._generation
        slot = int(lib.shm_slab_acquire(self._meta, owner, time.monotonic_ns(), generation))
        if slot < 0:
            self._raise(slot, "acquire", owner=owner)
        return Lease(slot, int(generation[0]), owner)

    def acquire_array(
        self, owner: int, dtype: Any, shape: tuple[int, ...]
    ) -> tuple[Lease, np.ndarray[Any, Any]]:
        """:meth:`acquire` and the slot as a writable array, in one call (the hot path)."""
        lease = self.acquire(owner)
        return lease, self._array(lease.slot, dtype, shape, readonly=False)

    def writable(self, lease: Lease, dtype: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        """The leased slot as a writable array: write the data here, once."""
        info = self.slot(lease.slot)
        if info.state is not SlotState.WRITING or info.generation != lease.generation:
            raise StaleSlot(f"slot {lease.slot} generation {lease.generation} is not being written")
        return self._array(lease.slot, dtype, shape, readonly=False)

    def publish(self, lease: Lease) -> None:
        """Make the written slot readable; StaleSlot if it was reclaimed meanwhile."""
        rc = lib.shm_slab_publish(self._meta, lease.slot, lease.generation)
        if rc:
            self._raise(rc, "publish", *lease)

    def abort(self, lease: Lease) -> None:
        """Give back a slot that was never published."""
        rc = lib.shm_slab_abort(self._meta, lease.slot, lease.generation)
        if rc:
            self._raise(rc, "abort", *lease)

    # -- reader -----------------------------------------------------------

    def view(
        self, slot: int, generation: int, dtype: Any, shape: tuple[int, ...]
    ) -> np.ndarray[Any, Any]:
        """A read-only view of a published slot's bytes: no copy."""
        if not lib.shm_slab_is_ready(self._meta, slot, generation):
            self._check_slot(slot)
            info = self.slot(slot)
            raise StaleSlot(
                f"slot {slot} generation {generation} is not published "
                f"(it is {info.state.name.lower()} at generation {info.generation})"
            )
        return self._array(slot, dtype, shape, readonly=True)

    def release(self, slot: int, generation: int, owner: int) -> None:
        """Hand a read slot back. StaleSlot for an old generation, ForeignSlot for
        another owner's slot; neither changes anything."""
        rc = lib.shm_slab_release(self._meta, slot, generation, owner)
        if rc:
            self._raise(rc, "release", slot, generation, owner)

    def reclaim(self, owner: int) -> int:
        """Free every slot ``owner`` holds (a dead peer's); returns how many."""
        n = int(lib.shm_slab_reclaim(self._meta, owner))
        if n < 0:
            self._raise(n, "reclaim", owner=owner)
        return n

    # -- introspection ----------------------------------------------------

    def slot(self, slot: int) -> SlotInfo:
        self._check_slot(slot)
        out = ffi.new("uint64_t[4]")
        lib.shm_slab_slot(self._meta, slot, out)
        return SlotInfo(SlotState(int(out[0])), int(out[1]), int(out[2]), int(out[3]))

    def held(self, owner: int) -> int:
        return int(lib.shm_slab_held(self._meta, owner))

    def statistics(self) -> SlabStatistics:
        s = self._raw_stats()
        return SlabStatistics(
            slots=s[0],
            slot_size=s[2],
            quota=s[3],
            acquired=s[4],
            released=s[5],
            stale_refused=s[6],
            quota_refused=s[7],
            full_events=s[8],
            reclaimed=s[9],
            held=s[10],
            high_water=s[11],
            aborted=s[12],
            foreign_refused=s[13],
        )

    def slot_address(self, slot: int) -> int:
        return self.segment.address + self.data_offset + slot * self.slot_size

    # -- CUDA -------------------------------------------------------------

    def pin(self) -> bool:
        """Register the slots as page-locked with CUDA; False (a no-op) without it."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return False
        if not self._pinned:
            size = self.slots * self.slot_size
            rc = torch.cuda.cudart().cudaHostRegister(self.slot_address(0), size, 0)
            if int(rc) != 0:
                raise SegmentError(f"cudaHostRegister of {size:,} bytes failed with {rc}")
            self._pinned = True
        return True

    def unpin(self) -> None:
        if self._pinned:
            torch = sys.modules["torch"]
            torch.cuda.cudart().cudaHostUnregister(self.slot_address(0))
            self._pinned = False

    # -- helpers ----------------------------------------------------------

    def _array(
        self, slot: int, dtype: Any, shape: tuple[int, ...], *, readonly: bool
    ) -> np.ndarray[Any, Any]:
        known = self._views.get((dtype, shape))
        if known is None:
            dt = np.dtype(dtype)
            count = math.prod(shape)
            if dt.itemsize * count > self.slot_size:
                nbytes = dt.itemsize * count
                raise ValueError(
                    f"{nbytes:,} bytes of {dt} {shape} exceed a slot ({self.slot_size:,})"
                )
            known = self._views[(dtype, shape)] = (dt, count)
        offset = self.data_offset + slot * self.slot_size
        return self.segment.view(offset, known[0], known[1], shape, readonly=readonly)

    def _raise(
        self, rc: int, call: str, slot: int = -1, generation: int = -1, owner: int = -1
    ) -> NoReturn:
        """The one place a C return code becomes an exception (csrc: SLAB_*)."""
        where = f"{call} of slot {slot} generation {generation}" if slot >= 0 else call
        if rc == _FULL:
            raise SlabFull(f"all {self.slots} slots of {self.segment.name} are in use")
        if rc == _QUOTA:
            raise QuotaExceeded(
                f"owner {owner} holds its quota of {self.quota} slots in {self.segment.name}; "
                "it must release one first"
            )
        if rc == _FOREIGN:
            raise ForeignSlot(f"{where} refused: the slot belongs to another owner than {owner}")
        if rc == _STALE:
            raise StaleSlot(f"{where} refused: stale (already released, reclaimed or published)")
        if slot >= self.slots:
            raise StaleSlot(f"slot {slot} does not exist (the slab has {self.slots})")
        raise ValueError(f"{where}: owner {owner} is out of range (max {self.max_owners - 1})")

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise StaleSlot(f"slot {slot} does not exist (the slab has {self.slots})")

    def _raw_stats(self) -> list[int]:
        out = ffi.new("uint64_t[14]")
        lib.shm_slab_stats(self._meta, out)
        return [int(v) for v in out]
