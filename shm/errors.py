"""shm's errors: one hierarchy rooted in :class:`ShmError`, and :func:`check_rc`.

Each class says when it is raised. The non-blocking forms raise a
:class:`WouldBlock` subclass; the blocking forms raise the same class once their
timeout is spent. Argument errors (an owner past the slab's, a ring capacity
that is no power of two) are :class:`ValueError`, as anywhere in Python.

The C returns one status enum (``enum shm_status`` in ``csrc/shm_native.h``)
whose negative values each mean one thing across the module, so
:func:`check_rc` is the one place a C status becomes an exception, as pyzmq's
``_check_rc``: the caller says what it did to what, the code says what went
wrong and what to do about it.
"""

from __future__ import annotations

from typing import NoReturn

from shm.native import lib


class ShmError(Exception):
    """Base class of every error the transport raises."""


class SegmentError(ShmError):
    """A shared-memory segment could not be created, opened or used."""


class SegmentExistsError(SegmentError):
    """A segment of that name exists already (create never replaces one)."""


class SegmentNotFoundError(SegmentError):
    """No segment of that name exists."""


class ForeignSegmentError(SegmentError):
    """The named object is not an rte segment (wrong magic, too small, or not
    yet initialised by its creator)."""


class SegmentVersionError(SegmentError):
    """The segment was laid out by another version of rte."""


class SegmentSpaceError(SegmentError):
    """The shared-memory filesystem has too little room for the segment."""


class WouldBlock(ShmError):
    """The operation could not complete now (non-blocking forms), or within its
    timeout (blocking forms)."""


class RingFull(WouldBlock):
    """The ring has no room for the record: the consumer is behind (backpressure)."""


class RingEmpty(WouldBlock):
    """The ring holds no record."""


class RecordTooLarge(ShmError):
    """A record is larger than the ring's largest (half its capacity); it can never fit."""


class RingCorrupt(ShmError):
    """The ring's bytes are not valid records: something other than a push wrote them.
    Nothing was consumed; reset the ring once both peers are stopped."""


class SlabFull(WouldBlock):
    """No slot of the slab is free."""


class QuotaExceeded(WouldBlock):
    """The owner already holds its quota of slots; it must release one first."""


class StaleSlot(ShmError):
    """A slot reference (index, generation) is no longer valid: it was released
    or reclaimed, and may have been reused since."""


class ForeignSlot(ShmError):
    """A release named a slot that another owner holds."""


class LayoutError(ShmError, ValueError):
    """A dtype, shape, size or offset that no view of shared memory may have
    (negative, zero, not an integer, an object dtype, or past the slot or the
    segment): refused before anything is mapped. Also a :class:`ValueError`, as
    every argument error of this module."""


# status -> (class, what happened and what to do). The caller's ``where`` says
# what was done to what; both make the message.
_STATUS: dict[int, tuple[type[Exception], str]] = {
    lib.SHM_RING_FULL: (
        RingFull,
        "the ring is full: its consumer is not keeping up (backpressure); "
        "retry later, or push with a timeout",
    ),
    lib.SHM_RING_EMPTY: (RingEmpty, "the ring is empty; pop with a timeout to wait for a record"),
    lib.SHM_RING_TOO_LARGE: (
        RecordTooLarge,
        "the record exceeds this ring's largest (half its capacity) and can never fit; "
        "send bulk data through a slab slot and only its reference through the ring",
    ),
    lib.SHM_RING_CORRUPT: (
        RingCorrupt,
        "the ring holds bytes that are not valid records (something other than a push "
        "wrote them); nothing was consumed: reset the ring once both peers are stopped",
    ),
    lib.SHM_RING_SHORT_BUFFER: (
        ValueError,
        "the buffer is smaller than the next record, which stays in the ring; "
        "pass a buffer as large as the ring's largest record",
    ),
    lib.SHM_SLAB_FULL: (
        SlabFull,
        "every slot of the slab is in use; wait for readers to release slots, "
        "or make the slab larger",
    ),
    lib.SHM_SLAB_QUOTA: (
        QuotaExceeded,
        "the owner already holds its quota of slots; it must release one first",
    ),
    lib.SHM_SLAB_FOREIGN: (
        ForeignSlot,
        "the slot belongs to another owner, and only its owner may release it "
        "(nothing changed); check the reference the writer sent",
    ),
    lib.SHM_SLAB_RANGE: (
        ValueError,
        "the slot or the owner is past the slab's (see its slots and max_owners)",
    ),
    lib.SHM_SLAB_STALE: (
        StaleSlot,
        "stale: the slot is not in the state this needs at that generation (it was "
        "already released, aborted, published or reclaimed, and may have been reused); "
        "nothing changed, and the reference must not be used again",
    ),
    lib.SHM_LAYOUT_MISSING: (
        SegmentError,
        "nothing is laid out there (no magic, or the region is too small); check the "
        "offset, and that the creator has finished initialising it",
    ),
    lib.SHM_LAYOUT_DAMAGED: (
        SegmentError,
        "its header is damaged (inconsistent sizes); stop its users and recreate it",
    ),
    lib.SHM_LAYOUT_TOO_BIG: (
        SegmentError,
        "its header says it runs past the end of the segment; the offset is wrong "
        "or the segment is not the one it was made in",
    ),
    lib.SHM_BAD_ARGUMENT: (ValueError, "an argument is out of range"),
}


def check_rc(rc: int, where: str) -> int:
    """Return a C status ``rc`` that is not an error (>= 0), or raise its exception.

    Args:
        rc: what a C function of ``shm._native`` returned (a count, a length, or
            a member of ``enum shm_status``).
        where: what the call did to what, for the message, e.g.
            ``"release of slot 3 generation 7 by owner 1 in /rte.0.x.slab"``.

    Raises:
        ShmError: the subclass mapped from ``rc`` (RingFull, StaleSlot, ...), or
            ShmError itself for a code this Python does not know.
        ValueError: for an argument the C refused (a slot or owner out of
            range, a buffer too small, a bad size).
    """
    if rc >= 0:
        return rc
    _raise(rc, where)


def _raise(rc: int, where: str) -> NoReturn:
    known = _STATUS.get(rc)
    if known is None:
        raise ShmError(
            f"{where}: unknown status {rc} from shm's C module; "
            "reinstall rte so its compiled module matches its Python"
        )
    cls, what = known
    raise cls(f"{where}: {what}")
