"""SlabCore: a slab as this process opened it, what its slot and batch sides share.

A slab has two ways in: one slot at a time (:class:`~shm.slab.Slab`'s
``loan``/``receive`` and :mod:`shm.loans`) and a step's slots at once
(:mod:`shm.batch`). Both stand on this core and on nothing private of each
other: the C handle and the geometry (read once, at open, into a process-local
``shm_slab_t``: readers write the header in shared memory, so the C never
trusts it again), the layouts and NumPy views of the slots, the hand-back of a
published slot, the snapshots, and the words that say in an error which slot
and whose. So ``shm.slab`` imports ``shm.batch`` and ``shm.loans``, and those
import this, never the other way round.

Views: every ``(dtype, shape)`` is checked once (:func:`~shm.views.checked_layout`,
for a slot's bytes) and cached; the slots as one ``(slots, *shape)`` array,
strided by the slot size (:meth:`SlabCore.typed`), are made once per dtype,
shape and access, and a run of slots is one slice of it. Those views are kept
in the segment's :meth:`~shm.segment.Segment.view_cache`, which its ``close``
empties; a view a caller still holds keeps the mapping (never unmapped under it).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from shm.errors import SegmentError, StaleSlot, check_rc
from shm.native import ffi, lib
from shm.segment import Segment, page_align
from shm.slots import SlabStatistics, SlotInfo, SlotRef
from shm.views import checked_layout

_RANGE = int(lib.SHM_SLAB_RANGE)
MAX_RUNS = 256  # runs whose views a slab keeps (then it forgets them all and starts over)


class SlabCore:
    """The slab in ``segment`` at ``offset``, opened in this process.

    Attributes:
        segment, offset: where the slab lies.
        slots, max_owners, slot_size, quota: its geometry, read once at open.
        data_offset: where slot 0's bytes begin in the segment (on a page).
    """

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
        self._layouts: dict[tuple[Any, tuple[int, ...]], tuple[np.dtype[Any], int]] = {}
        self._typed: dict[tuple[Any, ...], np.ndarray[Any, Any]] = segment.view_cache()
        self._runs: dict[tuple[Any, ...], list[Any]] = segment.view_cache()

    @property
    def meta(self) -> Any:
        """The slab's ``shm_slab_t *``, for the C calls; refused once the segment is
        closed in this process (the C would reach unmapped memory)."""
        if self.segment.closed:
            raise SegmentError(
                f"the slab in {self.segment.name} is closed in this process (views "
                "still held stay readable); open it again to use it"
            )
        return self._meta

    # -- views of the slots -----------------------------------------------

    def layout(self, dtype: Any, shape: tuple[int, ...]) -> tuple[np.dtype[Any], int]:
        """The NumPy dtype and element count of ``dtype`` x ``shape``, checked once
        for a slot's bytes and cached per (dtype, shape) for the hot paths.

        Raises:
            LayoutError: no layout a slot can hold (:func:`~shm.views.checked_layout`).
        """
        key = (dtype, shape)
        try:
            return self._layouts[key]
        except (KeyError, TypeError):  # not seen yet, or unhashable (never cached)
            pass
        layout = checked_layout(dtype, shape, self.slot_size, f"a slot of {self.segment.name}")
        with contextlib.suppress(TypeError):  # an unhashable dtype spec: checked each time
            self._layouts[key] = layout
        return layout

    def slot_view(
        self, slot: int, dtype: np.dtype[Any], count: int, shape: tuple[int, ...], readonly: bool
    ) -> np.ndarray[Any, Any]:
        """Slot ``slot``'s bytes as one array (``dtype`` and ``count`` from :meth:`layout`)."""
        offset = self.data_offset + slot * self.slot_size
        return self.segment.view(offset, dtype, count, shape, readonly=readonly)

    def typed(
        self, dtype: np.dtype[Any], shape: tuple[int, ...], readonly: bool
    ) -> np.ndarray[Any, Any]:
        """Every slot as one ``(slots, *shape)`` array, strided by the slot size; made
        once per dtype, shape and access (a run of slots is then one slice of it)."""
        key = (dtype, shape, readonly)
        view = self._typed.get(key)
        if view is None:
            # Segment.rows: the view holds the mapping, so a batch a caller still
            # holds stays readable after the segment is closed
            view = self._typed[key] = self.segment.rows(
                self.data_offset, self.slots, self.slot_size, dtype, shape, readonly=readonly
            )
        return view

    def run(
        self,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        readonly: bool,
        first: int,
        n: int,
        split: bool,
    ) -> tuple[np.ndarray[Any, Any], tuple[np.ndarray[Any, Any], ...]]:
        """Slots ``first .. first + n - 1`` as one ``(n, *shape)`` array and (given
        ``split``) as its rows, made once per run and layout and then reused: a
        writer takes the same few runs step after step, and 64 fresh row views cost
        more than the rest of its loan (a view is the slot's memory whoever holds
        it; a model writes into it, it never changes it)."""
        key = (dtype, shape, readonly, first, n)
        made = self._runs.get(key)
        if made is None:
            if len(self._runs) >= MAX_RUNS:  # (batch sizes that keep changing)
                self._runs.clear()
            block = self.typed(dtype, shape, readonly)[first : first + n]
            made = self._runs[key] = [block, ()]
        if split and not made[1]:
            made[1] = tuple(made[0])
        return made[0], made[1]

    def slot_address(self, slot: int) -> int:
        """The address of slot ``slot``'s bytes in this process."""
        return self.segment.address + self.data_offset + slot * self.slot_size

    # -- the hand-back every reader form uses ------------------------------

    def release(self, ref: SlotRef) -> None:
        """Hand a published slot back (READY -> FREE, next generation).

        What :meth:`Sample.release <shm.loans.Sample.release>` calls; a writer
        also calls it for a slot it published that no reader will take.

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
                self.check_slot(ref.slot)
            check_rc(rc, self.where("release", ref))

    # -- snapshots --------------------------------------------------------

    def slot(self, slot: int) -> SlotInfo:
        """A snapshot of one slot's state, generation and holder."""
        self.check_slot(slot)
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

    # -- what an error says -----------------------------------------------

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

    def loan_where(self, owner: int) -> str:
        """For an error message: a loan for ``owner``, and what the slab and that
        owner hold now."""
        held = self.held(owner)
        return (
            f"loan of a slot for owner {owner} in {self.segment.name} ({self.slots} slots, "
            f"a quota of {self.quota} per owner; that owner holds {held}, "
            f"owners are 0-{self.max_owners - 1})"
        )

    def check_slot(self, slot: int) -> None:
        """Refuse a slot number this slab does not have.

        Raises:
            StaleSlot: ``slot`` is outside ``0 .. slots-1`` (the reference is
                not from this slab).
        """
        if not 0 <= slot < self.slots:
            raise StaleSlot(
                f"slot {slot} does not exist in {self.segment.name} (the slab has "
                f"{self.slots}); the reference is not from this slab"
            )
