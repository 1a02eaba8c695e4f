"""Slab: fixed-size slots in shared memory, written once, read in place.

Loans manage themselves, as iceoryx2's (``loan`` -> write -> ``send``). The
writer takes a free slot for an owner with :meth:`Slab.loan` and gets a
:class:`~shm.loans.Loan`: its ``array`` is a writable NumPy view of the slot,
written once, in place; ``publish()`` makes it readable, ``abort()`` gives it
back unread, and a ``with`` block aborts a loan it leaves unfinished, so an
exception while writing never leaks a slot. The writer then sends the loan's :class:`SlotRef`
(slot, generation, owner) to the reader over a ring. The reader turns it back
into a :class:`~shm.loans.Sample` with :meth:`Slab.receive`: a read-only view of the slot's
bytes, no copy, which ``release()`` or the end of a ``with`` block hands back.
Nobody passes (slot, generation, owner) as three loose ints.

Each slot's state word (free / writing / ready) carries a generation that every
publish, abort and release must name, so a stale one is refused instead of
freeing a slot that was reused. Owners have quotas, so a reader that holds all
its slots stalls only itself; :meth:`Slab.reclaim` frees a dead owner's slots
in one call. Counters live in the slab's header, for inspectors. The slots
begin on a page and are :data:`SLOT_ALIGN` bytes apart (a multiple of it), not
a page: a 3 KiB frame moves in 3 KiB, not 4, so a step's run of frames is one
dense device-to-host copy at the link's full rate. The C returns
``enum shm_status`` codes; :func:`~shm.errors.check_rc` turns a refusal into its
exception, with a message built here that says which slot and whose.

Every dtype and shape is checked once per layout (no negative, zero or
non-integer dimension, no object dtype, no more than a slot): a
:class:`~shm.errors.LayoutError`, no slot taken. Once its segment is closed
in this process a slab refuses every call (:class:`~shm.errors.SegmentError`)
instead of reaching unmapped memory; views already handed out stay readable.

What a reader can reach: :meth:`open_reader` maps the slot bytes read-only,
and only the metadata (header counters, per-owner held counts, slot words)
writable, since a release is a compare-and-swap on the slot's word. So a reader
can never write a frame, but one that scribbles the metadata can free, hold or
count other owners' slots (stalling or garbling their streams). It can never
make the slab's writer touch memory outside it: the slot and owner counts,
slot size and quota are read once, at open, into a process-local
``shm_slab_t``, and every slot or owner index is range-checked against them.

:meth:`Slab.pin` registers the slots as page-locked memory with CUDA when torch
with CUDA is already imported (device-to-host copies then go straight in,
asynchronously); elsewhere it does nothing, and never imports torch.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np

from shm import batch, cuda
from shm.batch import BatchLoan, BatchSample
from shm.errors import SegmentError, StaleSlot, check_rc
from shm.loans import Loan, Sample
from shm.native import ffi, lib
from shm.segment import Segment, page_align
from shm.slots import SlabStatistics, SlotInfo, SlotRef
from shm.views import checked_layout

__all__ = ["Loan", "Sample", "Slab"]

_RANGE = int(lib.SHM_SLAB_RANGE)
_STALE = int(lib.SHM_SLAB_STALE)
_new_tuple = tuple.__new__  # makes a SlotRef at half the cost of calling the class
SLOT_ALIGN = 512  # what DMA engines and vector readers want; a page would waste up to 4 KiB


def slot_align(n: int) -> int:
    """``n`` bytes rounded up to a whole number of :data:`SLOT_ALIGN`."""
    return (n + SLOT_ALIGN - 1) // SLOT_ALIGN * SLOT_ALIGN


class Slab:
    """The slab in ``segment`` at ``offset`` (made by :meth:`create`)."""

    def __init__(self, segment: Segment, offset: int) -> None:
        self.segment = segment
        self.offset = offset
        # the slab as this process opened it: its geometry, read once, is what the
        # C uses from now on, never the header in shared memory (readers write there)
        self._meta = ffi.new("shm_slab_t *")
        check_rc(
            int(lib.shm_slab_open(self._meta, segment.ptr(offset), segment.size - offset)),
            f"opening the slab at offset {offset} of {segment.name}",
        )
        stats = self.statistics()
        self.slots, self.max_owners = stats.slots, stats.max_owners
        self.slot_size, self.quota = stats.slot_size, stats.quota
        meta = int(lib.shm_slab_meta_size(self.slots, self.max_owners))
        self.data_offset = page_align(offset + meta)
        if self.data_offset + self.slots * self.slot_size > segment.size:
            raise SegmentError(f"{segment.name}: slab at {offset} runs past the segment")
        self._pinned = False
        self._pin_device: int | None = None
        self._generation = ffi.new("uint64_t *")  # acquire's out-parameter, reused
        self._layouts: dict[tuple[Any, tuple[int, ...]], tuple[np.dtype[Any], int]] = {}
        self._typed: dict[tuple[Any, ...], Any] = segment.view_cache()  # shm.batch.typed's

    @property
    def meta(self) -> Any:
        """The slab's header, for the C calls; refused once the segment is closed
        in this process (the C would reach unmapped memory)."""
        if self.segment.closed:
            raise SegmentError(
                f"the slab in {self.segment.name} is closed in this process (views "
                "still held stay readable); open it again to use it"
            )
        return self._meta

    @classmethod
    def open_reader(cls, name: str, offset: int, *, kind: int | None = None) -> Slab:
        """Open the slab at ``offset`` of segment ``name`` as a reader sees it.

        The slots are mapped read-only, so a reader cannot write into anyone's
        data by any means (not even by setting a view's ``writeable`` flag);
        only the slot state words are writable, for :meth:`release`. The caller
        closes ``slab.segment``.
        """
        with Segment.open(name, kind=kind, readonly=True) as probe:  # where the slots begin
            data_offset = cls(probe, offset).data_offset
        segment = Segment.open(name, kind=kind, writable_below=data_offset)
        try:
            return cls(segment, offset)
        except BaseException:
            segment.close()
            raise

    @staticmethod
    def footprint(offset: int, slots: int, slot_bytes: int, max_owners: int) -> int:
        """Bytes from ``offset`` to the end of such a slab (metadata, alignment, slots)."""
        meta = int(lib.shm_slab_meta_size(slots, max_owners))
        return page_align(offset + meta) - offset + slots * slot_align(slot_bytes)

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
        """Lay out ``slots`` free slots of at least ``slot_bytes`` each (a multiple of
        :data:`SLOT_ALIGN`).

        ``quota`` is the most slots one owner may hold (0: no limit but the slab's).
        """
        if slots < 1 or slot_bytes < 1 or max_owners < 1:
            raise ValueError("a slab needs at least one slot of one byte and one owner")
        if (
            offset % 128
            or offset + cls.footprint(offset, slots, slot_bytes, max_owners) > segment.size
        ):
            raise ValueError(f"slab of {slots} x {slot_bytes} B at {offset} does not fit")
        check_rc(
            lib.shm_slab_init(
                segment.ptr(offset), slots, max_owners, slot_align(slot_bytes), quota
            ),
            f"creating a slab of {slots} x {slot_bytes} B for {max_owners} owners "
            f"in {segment.name}",
        )
        return cls(segment, offset)

    # -- writer -----------------------------------------------------------

    def loan(self, owner: int, dtype: Any, shape: tuple[int, ...]) -> Loan:
        """Take a free slot for ``owner``, as a writable array of ``dtype`` and ``shape``.

        The hot path of a writer: one C call, and the array is a view of the
        slot (no copy). Write it once, then :meth:`Loan.publish` it.

        Raises:
            SlabFull: no slot is free.
            QuotaExceeded: ``owner`` holds its quota of slots.
            LayoutError: ``dtype`` x ``shape`` is no layout a slot can hold
                (:func:`~shm.views.checked_layout`); no slot is taken.
            ValueError: ``owner`` is past ``max_owners`` (no slot is taken).
            SegmentError: the segment is closed in this process.
        """
        # (not *-unpacked into view below: a star call skips CPython's fast path)
        dt, count = self._layout(dtype, shape)
        generation = self._generation
        slot = lib.shm_slab_acquire(self.meta, owner, time.monotonic_ns(), generation)
        if slot < 0:
            check_rc(slot, self._loan_where(owner))
        ref: SlotRef = _new_tuple(SlotRef, (slot, generation[0], owner))
        try:
            array = self.segment.view(
                self.data_offset + slot * self.slot_size, dt, count, shape, readonly=False
            )
        except BaseException:
            lib.shm_slab_abort(self._meta, slot, ref.generation)  # never leak the slot
            raise
        return Loan(self, ref, array)

    def loan_batch(self, owner: int, n: int, dtype: Any, shape: tuple[int, ...]) -> BatchLoan:
        """Take ``n`` slots for ``owner`` in one call (see :func:`shm.batch.loan_batch`)."""
        return batch.loan_batch(self, owner, n, self._layout(dtype, shape)[0], shape)

    # -- reader -----------------------------------------------------------

    def receive_batch(
        self, owner: int, slots: Any, generations: Any, dtype: Any, shape: tuple[int, ...]
    ) -> BatchSample:
        """Published slots as read-only arrays (see :func:`shm.batch.receive_batch`)."""
        dt = self._layout(dtype, shape)[0]
        return batch.receive_batch(self, owner, slots, generations, dt, shape)

    def receive(self, ref: SlotRef, dtype: Any, shape: tuple[int, ...]) -> Sample:
        """The published slot ``ref`` as a read-only array of ``dtype`` and ``shape``.

        The hot path of a reader: the array is a view of the slot (no copy).
        Release the :class:`Sample` when done with it.

        Raises:
            StaleSlot: the slot is not published at ``ref.generation`` (the
                message says what it is), or no such slot exists.
            LayoutError: ``dtype`` x ``shape`` is no layout a slot can hold.
            SegmentError: the segment is closed in this process.
        """
        dt, count = self._layout(dtype, shape)
        # acquire inside (pairs with publish's release): the slot's bytes are whole
        if not lib.shm_slab_is_ready(self.meta, ref.slot, ref.generation):
            self._check_slot(ref.slot)
            check_rc(_STALE, self.where("receive", ref))
        array = self.segment.view(
            self.data_offset + ref.slot * self.slot_size, dt, count, shape, readonly=True
        )
        return Sample(self, ref, array)

    def release(self, ref: SlotRef) -> None:
        """Hand a published slot back (READY -> FREE, next generation).

        What :meth:`Sample.release` calls; a writer also calls it for a slot it
        published that no reader will take.

        Raises:
            StaleSlot: an old generation (already released, or reclaimed), or
                no such slot; nothing changes.
            ForeignSlot: the slot is another owner's; nothing changes.
            ValueError: ``ref.owner`` is past ``max_owners``.
            SegmentError: the segment is closed in this process.
        """
        rc = lib.shm_slab_release(self.meta, ref.slot, ref.generation, ref.owner)
        if rc:
            if rc == _RANGE:
                self._check_slot(ref.slot)
            check_rc(rc, self.where("release", ref))

    def reclaim(self, owner: int) -> int:
        """Free every slot ``owner`` holds (a dead peer's); returns how many.

        Its loans and samples then fail with StaleSlot when published,
        aborted or released.
        """
        return check_rc(
            int(lib.shm_slab_reclaim(self.meta, owner)),
            f"reclaim of owner {owner}'s slots in {self.segment.name} "
            f"(owners 0-{self.max_owners - 1})",
        )

    # -- introspection ----------------------------------------------------

    def slot(self, slot: int) -> SlotInfo:
        """A snapshot of one slot's state, generation and holder."""
        self._check_slot(slot)
        out = ffi.new("shm_slot_info_t *")
        lib.shm_slab_slot(self.meta, slot, out)
        return SlotInfo.from_c(out)

    def held(self, owner: int) -> int:
        """How many slots ``owner`` holds now (0 for an owner past the slab's)."""
        return int(lib.shm_slab_held(self.meta, owner))

    def statistics(self) -> SlabStatistics:
        """A snapshot of the slab's counters, read from shared memory."""
        out = ffi.new("shm_slab_stats_t *")
        lib.shm_slab_stats(self.meta, out)
        return SlabStatistics.from_c(out)

    def slot_address(self, slot: int) -> int:
        """The address of slot ``slot``'s bytes in this process."""
        return self.segment.address + self.data_offset + slot * self.slot_size

    # -- CUDA -------------------------------------------------------------

    def pin(self, device: int | None = None) -> bool:
        """Register the slots as page-locked with CUDA, from ``device``'s context;
        False (a no-op) without torch with CUDA imported (see :mod:`shm.cuda`).

        Raises:
            SegmentError: cudaHostRegister refused the slots.
        """
        if not self._pinned:
            size = self.slots * self.slot_size
            self._pinned = cuda.register(self.slot_address(0), size, self.segment.name, device)
            self._pin_device = device
        return self._pinned

    def unpin(self) -> None:
        """Undo :meth:`pin` (before the segment is closed); a no-op when not pinned.

        Raises:
            SegmentError: cudaHostUnregister refused; the slab counts as unpinned
                either way (see :func:`shm.cuda.unregister`).
        """
        if self._pinned:
            self._pinned = False
            cuda.unregister(self.slot_address(0), self.segment.name, self._pin_device)

    # -- helpers ----------------------------------------------------------

    def _layout(self, dtype: Any, shape: tuple[int, ...]) -> tuple[np.dtype[Any], int]:
        """The NumPy dtype and element count of ``dtype`` x ``shape``, checked once
        (:func:`~shm.views.checked_layout`, for a slot's bytes) and cached per
        (dtype, shape) for the hot paths."""
        key = (dtype, shape)
        try:
            return self._layouts[key]
        except (KeyError, TypeError):  # not seen yet, or unhashable (never cached)
            pass
        layout = checked_layout(dtype, shape, self.slot_size, f"a slot of {self.segment.name}")
        with contextlib.suppress(TypeError):  # an unhashable dtype spec: checked each time
            self._layouts[key] = layout
        return layout

    def where(self, call: str, ref: SlotRef) -> str:
        """For an error message: the call, the reference, and the slot as it is now."""
        where = (
            f"{call} of slot {ref.slot} generation {ref.generation} by owner {ref.owner} "
            f"in {self.segment.name}"
        )
        if not 0 <= ref.slot < self.slots:
            return f"{where} (the slab has slots 0-{self.slots - 1})"
        info = self.slot(ref.slot)
        return (
            f"{where} (the slot is {info.state.name.lower()} at generation {info.generation}, "
            f"owner {info.owner}; owners are 0-{self.max_owners - 1})"
        )

    def _loan_where(self, owner: int) -> str:
        held = self.held(owner)
        return (
            f"loan of a slot for owner {owner} in {self.segment.name} ({self.slots} slots, "
            f"a quota of {self.quota} per owner; that owner holds {held}, "
            f"owners are 0-{self.max_owners - 1})"
        )

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise StaleSlot(
                f"slot {slot} does not exist in {self.segment.name} (the slab has "
                f"{self.slots}); the reference is not from this slab"
            )
