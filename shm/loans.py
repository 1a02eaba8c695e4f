"""Loan and Sample: one slab slot as its writer and its reader hold it.

Loans manage themselves, as iceoryx2's (``loan`` -> write -> ``send``): a
:class:`Loan` (from :meth:`shm.slab.Slab.loan`) is written once in place, then
published or aborted, and a ``with`` block aborts one it leaves unfinished, so
an exception while writing never leaks a slot. A :class:`Sample` (from
:meth:`shm.slab.Slab.receive`) is read in place and released once. Each holds
its array, and the array holds the segment's mapping: a slot held past the
segment's ``close`` stays readable, and giving it back then does nothing (the
process has let go of the slab). The batch forms are :mod:`shm.batch`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np

from shm.errors import StaleSlot, check_rc
from shm.native import lib
from shm.slots import SlotRef

if TYPE_CHECKING:  # types only: the loans stand on the core, never on Slab
    from shm.slab_core import SlabCore


class Loan:
    """A slot the writer holds: write :attr:`array` once, then publish or abort.

    Made by :meth:`Slab.loan`. As a context manager it aborts on exit unless it
    was published or aborted (a slot reclaimed meanwhile is left as it is).
    Once finished, a further :meth:`publish` or :meth:`abort` is refused by the
    C with :class:`~shm.errors.StaleSlot` (and counted as stale).

    Attributes:
        ref: the slot's reference, for the reader once published.
        array: the slot's bytes as a writable array of the loan's dtype and
            shape: the slab's own memory, no copy.
    """

    __slots__ = ("_finished", "_slab", "array", "ref")

    def __init__(self, slab: SlabCore, ref: SlotRef, array: np.ndarray[Any, Any]) -> None:
        self._slab = slab
        self._finished = False
        self.ref = ref
        self.array = array

    @property
    def finished(self) -> bool:
        """Whether :meth:`publish` or :meth:`abort` was called."""
        return self._finished

    def publish(self) -> SlotRef:
        """Make the written slot readable (WRITING -> READY); return its reference.

        Raises:
            StaleSlot: the slot was reclaimed meanwhile, or the loan is finished.
            SegmentError: the slab's segment is closed in this process.
        """
        self._finished = True
        ref = self.ref
        rc = lib.shm_slab_publish(self._slab.meta, ref.slot, ref.generation)
        if rc:
            check_rc(rc, self._slab.where("publish", ref))
        return ref

    def abort(self) -> None:
        """Give the slot back unpublished (WRITING -> FREE, next generation); once
        the slab's segment is closed in this process there is nothing to give back.

        Raises:
            StaleSlot: the slot was reclaimed meanwhile, or the loan is finished.
        """
        self._finished = True
        ref = self.ref
        if self._slab.segment.closed:
            return
        rc = lib.shm_slab_abort(self._slab.meta, ref.slot, ref.generation)
        if rc:
            check_rc(rc, self._slab.where("abort", ref))

    def __enter__(self) -> Loan:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._finished:
            with contextlib.suppress(StaleSlot):  # reclaimed meanwhile: nothing to give back
                self.abort()

    def __repr__(self) -> str:
        state = "finished" if self._finished else "open"
        return f"<Loan {state} {self.ref} in {self._slab.segment.name}>"


class Sample:
    """A published slot the reader holds: read :attr:`array`, then release it.

    Made by :meth:`Slab.receive`. :meth:`release` is idempotent; as a context
    manager it releases on exit.

    Attributes:
        ref: the slot's reference, as the writer sent it.
        array: the slot's bytes as a read-only array: the slab's own memory, no
            copy. Do not use it after :meth:`release`: the slot may be reused.
    """

    __slots__ = ("_released", "_slab", "array", "ref")

    def __init__(self, slab: SlabCore, ref: SlotRef, array: np.ndarray[Any, Any]) -> None:
        self._slab = slab
        self._released = False
        self.ref = ref
        self.array = array

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Hand the slot back (:meth:`SlabCore.release <shm.slab_core.SlabCore.release>`
        with the ref's owner), once.

        Later calls do nothing, also after a first call that raised; so does a
        call once the slab's segment is closed in this process (the array stays
        readable: it holds the mapping).

        Raises:
            StaleSlot: the slot was reclaimed while it was held (its owner was
                taken for dead); what was read from it may have been overwritten.
            ForeignSlot: the reference names another owner than the slot's.
        """
        if self._released:
            return
        self._released = True
        if not self._slab.segment.closed:
            self._slab.release(self.ref)

    def __enter__(self) -> Sample:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<Sample {state} {self.ref} in {self._slab.segment.name}>"
