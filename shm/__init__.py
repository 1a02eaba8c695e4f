"""shm: the shared-memory transport. It knows nothing of the engine.

- :class:`Segment` — a named POSIX shared-memory region with a versioned header
  (:mod:`shm.header`), backed whole at creation (:mod:`shm.backing`).
- :class:`Ring` — a lock-free SPSC ring of byte records inside a segment;
  how its consumer waits (:class:`WaitPolicy`, :func:`wait_any`) is
  :mod:`shm.waiting`.
- :class:`Doorbell` — the semaphore a sleeping ring consumer is woken by;
  :class:`~shm.fifo.FifoBell` the same as a FIFO, for an event loop.
- :class:`Slab` — fixed slots written once and read in place as NumPy views:
  a writer's :class:`Loan` is published and its :class:`SlotRef` sent over a
  ring; the reader's :class:`Sample` is released when read. A step's slots
  for one reader go as one :class:`BatchLoan` / :class:`BatchSample`
  (:mod:`shm.batch`): one call each to take, publish, check and release;
  :func:`one_run` says whether slots are one run, for every side, asked once
  per batch (:attr:`BatchLoan.contiguous`). Both sides stand on one core,
  :class:`~shm.slab_core.SlabCore`. Every view holds its mapping (a segment's
  ``close`` never unmaps under one), and every layout is checked first
  (:class:`LayoutError`).
- :mod:`shm.names` — the names of shared objects (:func:`shm_name`), and the
  listing and removal of a prefix's objects.
- :class:`NameLock` — one live process at a time owns a name; the kernel lets
  go when it dies.

The atomics, the ring and the slot states are C (``csrc/``), built with cffi;
the C's status codes become exceptions in one place, :func:`check_rc`.
"""

from shm.batch import BatchLoan, BatchSample
from shm.doorbell import Bell, Doorbell
from shm.errors import (
    ForeignSegmentError,
    ForeignSlot,
    LayoutError,
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
    check_rc,
)
from shm.lock import NameLock, NameLockHeld
from shm.names import shm_name
from shm.ring import Ring, WaitPolicy, max_record, wait_any
from shm.ring_stats import RingStatistics
from shm.segment import Segment, is_alive, process_start_time
from shm.slab import Loan, Sample, Slab
from shm.slots import SlabStatistics, SlotInfo, SlotRef, SlotState, one_run
from shm.words import Counts, Word

__all__ = [
    "BatchLoan",
    "BatchSample",
    "Bell",
    "Counts",
    "Doorbell",
    "ForeignSegmentError",
    "ForeignSlot",
    "LayoutError",
    "Loan",
    "NameLock",
    "NameLockHeld",
    "QuotaExceeded",
    "RecordTooLarge",
    "Ring",
    "RingCorrupt",
    "RingEmpty",
    "RingFull",
    "RingStatistics",
    "Sample",
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
    "SlotRef",
    "SlotState",
    "StaleSlot",
    "WaitPolicy",
    "Word",
    "WouldBlock",
    "check_rc",
    "is_alive",
    "max_record",
    "one_run",
    "process_start_time",
    "shm_name",
    "wait_any",
]
