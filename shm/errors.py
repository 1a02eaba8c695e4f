"""shm's errors: one hierarchy rooted in :class:`ShmError`.

Each says when it is raised. The non-blocking forms raise a :class:`WouldBlock`
subclass; the blocking forms raise the same class once their timeout is spent.
"""

from __future__ import annotations


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
