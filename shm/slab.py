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
exception, with a message (the core's) that says which slot and whose.

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

How it is cut: :class:`~shm.slab_core.SlabCore` is the slab as opened here
(geometry, views, snapshots, error words); :class:`Slab` is that core plus
making a slab and one slot at a time; :mod:`shm.batch` takes a step's slots on
the same core. Neither side reaches into the other.

:meth:`Slab.pin` registers the slots as page-locked memory with CUDA when torch
with CUDA is already imported (device-to-host copies then go straight in,
asynchronously); elsewhere it does nothing, and never imports torch.
"""

from __future__ import annotations

import time
from typing import Any

from shm import batch, cuda
from shm.batch import BatchLoan, BatchSample, Words
from shm.errors import check_rc
from shm.loans import Loan, Sample
from shm.native import ffi, lib
from shm.segment import Segment, page_align
from shm.slab_core import SlabCore
from shm.slots import SlotRef

__all__ = ["Loan", "Sample", "Slab"]

_STALE = int(lib.SHM_SLAB_STALE)
_new_tuple = tuple.__new__  # makes a SlotRef at half the cost of calling the class
SLOT_ALIGN = 512  # what DMA engines and vector readers want; a page would waste up to 4 KiB


def slot_align(n: int) -> int:
    """``n`` bytes rounded up to a whole number of :data:`SLOT_ALIGN`."""
    return (n + SLOT_ALIGN - 1) // SLOT_ALIGN * SLOT_ALIGN


class Slab(SlabCore):
    """The slab in ``segment`` at ``offset`` (made by :meth:`create`).

    Its geometry, views, snapshots and error words are :class:`~shm.slab_core.SlabCore`'s,
    which the batch side (:mod:`shm.batch`) stands on too.
    """

    def __init__(self, segment: Segment, offset: int) -> None:
        super().__init__(segment, offset)
        self._pinned = False
        self._pin_device: int | None = None
        self._generation = ffi.new("uint64_t *")  # acquire's out-parameter, reused

    @classmethod
    def open_reader(cls, name: str, offset: int, *, kind: int | None = None) -> Slab:
        """Open the slab at ``offset`` of segment ``name`` as a reader sees it.

        The slots are mapped read-only, so a reader cannot write into anyone's
        data by any means (not even by setting a view's ``writeable`` flag);
        only the slot state words are writable, for :meth:`release`. The caller
        closes ``slab.segment``.
        """
        with Segment.open(name, kind=kind, readonly=True) as probe:  # where the slots begin
            data_offset = SlabCore(probe, offset).data_offset
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
        dt, count = self.layout(dtype, shape)
        generation, meta = self._generation, self.meta
        slot = lib.shm_slab_acquire(meta, owner, time.monotonic_ns(), generation)
        if slot < 0:
            check_rc(slot, self.loan_where(owner))
        ref: SlotRef = _new_tuple(SlotRef, (slot, generation[0], owner))
        try:
            array = self.segment.view(
                self.data_offset + slot * self.slot_size, dt, count, shape, readonly=False
            )
        except BaseException:
            lib.shm_slab_abort(meta, slot, ref.generation)  # never leak the slot
            raise
        return Loan(self, ref, array)

    def loan_batch(self, owner: int, n: int, dtype: Any, shape: tuple[int, ...]) -> BatchLoan:
        """Take ``n`` slots for ``owner`` in one call, as one run when one is free
        (see :func:`shm.batch.loan_batch`); whether they are one run is
        :attr:`BatchLoan.contiguous`, decided here, once."""
        return batch.loan_batch(self, owner, n, self.layout(dtype, shape)[0], shape)

    # -- reader -----------------------------------------------------------

    def receive_batch(
        self, owner: int, slots: Any, generations: Any, dtype: Any, shape: tuple[int, ...]
    ) -> BatchSample:
        """Published slots as read-only arrays (see :func:`shm.batch.receive_batch`)."""
        dt = self.layout(dtype, shape)[0]
        return batch.receive_batch(self, owner, slots, generations, dt, shape)

    def release_batch(self, owner: int, slots: Words, generations: Words) -> int:
        """Release published slots of ``owner`` in one call, without viewing them
        (see :func:`shm.batch.release_slots`); returns how many were."""
        return batch.release_slots(self, owner, slots, generations)

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
        dt, count = self.layout(dtype, shape)
        # acquire inside (pairs with publish's release): the slot's bytes are whole
        if not lib.shm_slab_is_ready(self.meta, ref.slot, ref.generation):
            self.check_slot(ref.slot)
            check_rc(_STALE, self.where("receive", ref))
        array = self.segment.view(
            self.data_offset + ref.slot * self.slot_size, dt, count, shape, readonly=True
        )
        return Sample(self, ref, array)

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
