"""shm: the shared-memory transport. It knows nothing of the engine.

- :class:`Segment` — a named POSIX shared-memory region with a versioned header.
- :class:`Ring` — a lock-free SPSC ring of byte records inside a segment.
- :class:`Doorbell` — the semaphore a sleeping ring consumer is woken by.
- :class:`Slab` — fixed slots written once and read in place as NumPy views.

The atomics, the ring and the slot states are C (``csrc/``), built with cffi.
"""

from shm.doorbell import Doorbell
from shm.errors import (
    ForeignSegmentError,
    ForeignSlot,
    QuotaExceeded,
    RecordTooLarge,
    RingCorrupt,
    RingEmpty,
    RingFull,
    SegmentError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSpaceError,
    SegmentVersionError,
    ShmError,
    SlabFull,
    StaleSlot,
    WouldBlock,
)
from shm.ring import Ring, RingStatistics, WaitPolicy, wait_any
from shm.segment import Segment, is_alive, shm_name
from shm.slab import Lease, Slab, SlabStatistics, SlotInfo, SlotState

__all__ = [
    "Doorbell",
    "ForeignSegmentError",
    "ForeignSlot",
    "Lease",
    "QuotaExceeded",
    "RecordTooLarge",
    "Ring",
    "RingCorrupt",
    "RingEmpty",
    "RingFull",
    "RingStatistics",
    "Segment",
    "SegmentError",
    "SegmentExistsError",
    "SegmentNotFoundError",
    "SegmentSpaceError",
    "SegmentVersionError",
    "ShmError",
    "Slab",
    "SlabFull",
    "SlabStatistics",
    "SlotInfo",
    "SlotState",
    "StaleSlot",
    "WaitPolicy",
    "WouldBlock",
    "is_alive",
    "shm_name",
    "wait_any",
]
