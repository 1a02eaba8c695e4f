"""Batches of slab slots: a step's chunks for one reader, leased and handed back in one call.

A writer that emits several chunks to one reader at once (a step of many
sessions) takes their slots with :func:`loan_batch`: one C call, all or none,
one run of adjacent slots whenever one is free, so the batch is one
``(n, *shape)`` array (strided by the slot size) and, on CUDA, one
device-to-host copy. :meth:`BatchLoan.publish` makes them readable in one call.
The reader rebuilds the batch from the slot numbers and generations the writer
sent (:func:`receive_batch`: one call checks every slot is published at that
generation; :meth:`BatchSample.judged` when the C checked them as it
popped their record, :class:`shm.steps.RowsReader`) and gives it back with
:meth:`BatchSample.release`, one call, or some rows with
:meth:`BatchSample.release_rows`.

"One run" is :func:`shm.slots.one_run`, which looks at every slot (a merged
step's ``[10, 12, 11, 13]`` is not one, though its endpoints say so), and it is
asked once per batch, when the batch is made (:func:`_rows`): a loan's
:attr:`BatchLoan.contiguous` is its answer for the writer and whatever the
writer tells its reader. The reader asks again of the slots it was sent, with
the same function: how it views the slab's memory never rests on a flag in a
record. The views hold
the segment's mapping (:meth:`shm.segment.Segment.rows`): a batch held past
the segment's ``close`` stays readable.

Slot numbers and generations travel as two columns of ``uint64`` words (a
``memoryview``, or a NumPy array): the C reads them in place
(``ffi.from_buffer``), so a batch costs no Python object per slot on either
side, and the hot paths make no NumPy call but the one view of the slots
(:meth:`~shm.slab_core.SlabCore.typed`; a paced step runs cold, where each NumPy call costs tens of
microseconds). The per-slot forms are :class:`shm.loans.Loan` and
:class:`shm.loans.Sample`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shm.errors import StaleSlot, check_rc
from shm.native import ffi, lib
from shm.slab_core import SlabCore
from shm.slots import one_run

Words = np.ndarray[Any, Any] | memoryview  # uint64 slot numbers or generations


def _u64(array: Words) -> Any:
    """A ``uint64_t *`` over a uint64 array's (or ``memoryview`` 's) own memory,
    read in place by the C."""
    return ffi.from_buffer("uint64_t[]", array)


def _rows(
    slab: SlabCore,
    slots: Words,
    dtype: np.dtype[Any],
    shape: tuple[int, ...],
    readonly: bool,
    split: bool = True,
    run: bool = False,
) -> tuple[bool, np.ndarray[Any, Any] | None, list[np.ndarray[Any, Any]]]:
    """(one run, the block or None, one array per row) for ``slots``: the one
    place a batch asks :func:`one_run` (unless ``run`` says the slots were taken
    as one, which the C's acquire does); with ``split`` False, a block's rows are
    left to be made on demand ([])."""
    if run or one_run(slots):  # every slot looked at, not the endpoints alone
        block, rows = slab.run(dtype, shape, readonly, int(slots[0]), len(slots), split)
        return True, block, list(rows)
    every = slab.typed(dtype, shape, readonly)
    views = [every[s] for s in slots.tolist()]
    return False, None, views


class _Slots:
    """What a writer's and a reader's batch share: whose slots, which, and their bytes."""

    __slots__ = ("_contiguous", "_slab", "block", "generations", "owner", "slots")
    _contiguous: bool  # set once, by the subclass's __init__ (from _rows)

    def __init__(
        self,
        slab: SlabCore,
        owner: int,
        slots: Words,
        generations: Words,
    ) -> None:
        self._slab = slab
        self.owner = owner
        self.slots = slots
        self.generations = generations

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def contiguous(self) -> bool:
        """Whether the slots are one run (:func:`shm.one_run`; then :attr:`block`
        is set), decided once, when the batch was made: carry it, do not ask again."""
        return self._contiguous


class BatchLoan(_Slots):
    """Slots the writer holds for one owner: write :attr:`rows`, then publish.

    Attributes:
        owner: the owner the slots are charged to.
        slots, generations: the slots and their generations (``uint64`` words: a
            ``memoryview`` or a NumPy array).
        contiguous: whether the slots are one run (then :attr:`block` is set),
            decided once at loan time (read-only).
        block: the run as one writable ``(n, *shape)`` array, or None.
        rows: one writable array per slot, in order (views of the block when
            contiguous): the slab's own memory, no copy.
    """

    __slots__ = ("_finished", "rows")

    def __init__(
        self,
        slab: SlabCore,
        owner: int,
        slots: Words,
        generations: Words,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        run: bool = False,
    ) -> None:
        """``run``: the slots were taken as one run (``slots[i] == slots[0] + i``)."""
        super().__init__(slab, owner, slots, generations)
        self._finished = False
        try:
            self._contiguous, self.block, self.rows = _rows(
                slab, slots, dtype, shape, False, run=run
            )
        except BaseException:
            lib.shm_slab_abort_batch(slab.meta, _u64(slots), _u64(generations), len(slots))
            raise

    def publish(self) -> None:
        """Make every slot readable (WRITING -> READY), in one call.

        Raises:
            StaleSlot: some slot was reclaimed meanwhile (its owner was taken
                for dead); every other slot is published all the same.
            SegmentError: the slab's segment is closed in this process.
        """
        self._finished = True
        rc = lib.shm_slab_publish_batch(
            self._slab.meta, _u64(self.slots), _u64(self.generations), len(self.slots)
        )
        if rc:
            check_rc(rc, f"publish of {len(self)} slots for owner {self.owner}")

    def mark_published(self) -> None:
        """Note that a call which publishes the slots itself
        (:meth:`shm.steps.RowsWriter.send`) has: :meth:`abort` does nothing from now."""
        self._finished = True

    def abort(self) -> None:
        """Give every slot back unpublished; slots reclaimed meanwhile are skipped
        (and all of them once the slab's segment is closed in this process)."""
        if self._finished:
            return
        self._finished = True
        if self._slab.segment.closed:
            return
        lib.shm_slab_abort_batch(
            self._slab.meta, _u64(self.slots), _u64(self.generations), len(self.slots)
        )


def loan_batch(
    slab: SlabCore, owner: int, n: int, dtype: np.dtype[Any], shape: tuple[int, ...]
) -> BatchLoan:
    """Take ``n`` slots for ``owner`` in one call, as one run when one is free.

    ``dtype`` and ``shape`` are checked by the caller (:meth:`Slab.loan_batch`
    does, once per layout); the view refuses rows larger than a slot all the same.

    Raises:
        QuotaExceeded: ``owner`` would hold more than its quota (nothing taken).
        SlabFull: fewer than ``n`` slots are free (nothing taken).
        LayoutError: ``dtype`` x ``shape`` exceeds a slot (nothing taken).
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"a batch needs at least one slot, got {n}")
    # plain words (memoryviews), not NumPy arrays: a paced turn runs cold, where
    # every NumPy call costs tens of microseconds
    slots = memoryview(bytearray(8 * n)).cast("Q")
    generations = memoryview(bytearray(8 * n)).cast("Q")
    rc = lib.shm_slab_acquire_batch(
        slab.meta, owner, n, time.monotonic_ns(), _u64(slots), _u64(generations)
    )
    if rc < 0:
        check_rc(rc, f"{slab.loan_where(owner)}; asked for {n} at once")
    # rc 1 says the C took a run on purpose: one run, nothing to look at; otherwise
    # whether the slots are one run is still one_run's to say (BatchLoan asks it
    # once): slots a racing release freed can form a run the C took one by one
    return BatchLoan(slab, owner, slots, generations, dtype, shape, run=rc == 1)


class BatchSample(_Slots):
    """Published slots the reader holds: read :attr:`rows`, then release them.

    Attributes:
        owner, slots, generations, contiguous, block, rows: as in
            :class:`BatchLoan`, read-only.
    """

    __slots__ = ("_held", "_rows")

    def __init__(
        self,
        slab: SlabCore,
        owner: int,
        slots: Words,
        generations: Words,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        verdict: tuple[np.ndarray[Any, Any], int] | None = None,
    ) -> None:
        super().__init__(slab, owner, slots, generations)
        if verdict is None:
            self._contiguous, self.block, self._rows = _rows(slab, slots, dtype, shape, True, False)
        else:  # (see judged)
            every, first = verdict
            if first >= 0:
                self._contiguous, self.block, self._rows = (
                    True,
                    every[first : first + len(slots)],
                    [],
                )
            else:
                self._contiguous, self.block = False, None
                self._rows = [every[s] for s in slots.tolist()]
        self._held: np.ndarray[Any, Any] | None = None  # per-row flags once one row is released

    @classmethod
    def judged(
        cls,
        slab: SlabCore,
        owner: int,
        slots: Words,
        generations: Words,
        every: np.ndarray[Any, Any],
        first: int,
    ) -> BatchSample:
        """Slots the C found published in one call as it popped their record
        (:class:`shm.steps.RowsReader`), viewed from its verdict: ``first`` the
        run's first slot, or negative when the slots are not one run (the C
        looked at every slot, as :func:`one_run` does); ``every``: the slab's
        read-only :meth:`~shm.slab_core.SlabCore.typed` view."""
        shape = tuple(every.shape[1:])
        return cls(slab, owner, slots, generations, every.dtype, shape, verdict=(every, first))

    @property
    def rows(self) -> list[np.ndarray[Any, Any]]:
        """One read-only array per slot (made on first use when the slots are one run)."""
        if not self._rows and self.block is not None:
            self._rows = list(self.block)
        return self._rows

    @property
    def released(self) -> bool:
        return self._held is not None and not self._held.any()

    def release(self) -> int:
        """Hand back every slot still held, in one call; returns how many were.

        Later calls do nothing, as does a call once the slab's segment is
        closed in this process (the rows stay readable: they hold the mapping).
        A slot reclaimed while it was held (its owner was taken for dead) is
        skipped: :class:`StaleSlot` is raised after the others are released,
        saying how many.
        """
        if self._held is None:
            slots, generations = self.slots, self.generations
        else:
            held = self._held
            slots, generations = np.asarray(self.slots)[held], np.asarray(self.generations)[held]
        self._held = np.zeros(len(self.slots), bool)
        return self._release(slots, generations)

    def release_rows(self, rows: np.ndarray[Any, Any]) -> int:
        """Hand back the slots of ``rows`` still held, in one call (idempotent per row)."""
        if self._held is None:
            self._held = np.ones(len(self.slots), bool)
        rows = rows[self._held[rows]]
        self._held[rows] = False
        return self._release(np.asarray(self.slots)[rows], np.asarray(self.generations)[rows])

    def _release(self, slots: Words, generations: Words) -> int:
        n = len(slots)
        if not n or self._slab.segment.closed:
            return 0
        done = ffi.new("uint64_t *")
        rc = lib.shm_slab_release_batch(
            self._slab.meta, _u64(slots), _u64(generations), n, self.owner, done
        )
        if rc:
            check_rc(rc, f"release of {n - done[0]} of {n} slots by owner {self.owner}")
        return int(done[0])


def release_slots(slab: SlabCore, owner: int, slots: Words, generations: Words) -> int:
    """Release published slots of ``owner`` in one call, without viewing them (a
    writer giving back what no reader will take); returns how many were."""
    done = ffi.new("uint64_t *")
    rc = lib.shm_slab_release_batch(
        slab.meta, _u64(slots), _u64(generations), len(slots), owner, done
    )
    if rc:
        check_rc(rc, f"release of {len(slots) - done[0]} of {len(slots)} slots of owner {owner}")
    return int(done[0])


def receive_batch(
    slab: SlabCore,
    owner: int,
    slots: Words,
    generations: Words,
    dtype: np.dtype[Any],
    shape: tuple[int, ...],
) -> BatchSample:
    """The published slots as read-only arrays (one call checks them all).

    Raises:
        StaleSlot: some slot is not published at its generation, or does not
            exist; nothing is held.
    """
    n = len(slots)
    ready = int(lib.shm_slab_ready_batch(slab.meta, _u64(slots), _u64(generations), n))
    if ready != n:
        slot = int(slots[ready])
        if not 0 <= slot < slab.slots:
            raise StaleSlot(f"slot {slot} does not exist in {slab.segment.name}")
        raise StaleSlot(
            f"slot {slot} generation {int(generations[ready])} of a batch of {n} is not "
            f"published in {slab.segment.name} (it is {slab.slot(slot).state.name.lower()})"
        )
    return BatchSample(slab, owner, slots, generations, dtype, shape)
