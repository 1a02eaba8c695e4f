"""What a slab's slots are, as values: states, references, snapshots.

:class:`SlotRef` is what a writer tells a reader (one slot, at one generation,
held by one owner); :class:`SlotInfo` and :class:`SlabStatistics` are snapshots
read from the slab's header in shared memory, built from the C structs of
``csrc/shm_native.h`` field by field, by name. :func:`one_run` is the one
answer to "are these slots one run" (a batch read as one array), for writers
and readers alike. The slab itself is :mod:`shm.slab`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from shm.native import ffi, lib


def one_run(slots: Sequence[int] | Any) -> bool:
    """Whether ``slots`` are adjacent and ascending (``s, s+1, ..., s+n-1``): then
    their bytes are one run of the slab, viewed as one array. Every slot is
    looked at: the endpoints alone pass ``[10, 12, 11, 13]``.

    ``slots``: slot numbers (a ``uint64`` ``memoryview``, NumPy array or list).
    """
    n = len(slots)
    if n == 0:
        return False
    first = int(slots[0])
    if int(slots[-1]) - first != n - 1:  # the cheap refusal first
        return False
    if n <= 2:
        return True
    if _words(slots):  # a batch's own words: every slot looked at in C
        return bool(lib.shm_one_run(ffi.from_buffer("uint64_t[]", slots), n))
    values = slots.tolist() if hasattr(slots, "tolist") else list(slots)
    return bool(values == list(range(first, first + n)))


def _words(slots: Any) -> bool:
    """Whether ``slots`` is one contiguous buffer of uint64 words (the C reads it)."""
    if isinstance(slots, memoryview):
        return slots.format == "Q" and slots.c_contiguous
    flags = getattr(slots, "flags", None)
    return flags is not None and slots.dtype == "uint64" and bool(flags.c_contiguous)


class SlotState(enum.IntEnum):
    """A slot's state (``enum shm_slot_state`` in ``csrc/shm_native.h``)."""

    FREE = int(lib.SHM_SLOT_FREE)
    WRITING = int(lib.SHM_SLOT_WRITING)
    READY = int(lib.SHM_SLOT_READY)


class SlotRef(NamedTuple):
    """One slot at one generation, held by ``owner``: what a writer tells a reader."""

    slot: int
    generation: int
    owner: int


@dataclass(frozen=True)
class SlotInfo:
    """One slot's state word and holder (a live snapshot; ``shm_slot_info_t``)."""

    state: SlotState
    generation: int
    owner: int
    since_ns: int  # time.monotonic_ns() when it was loaned

    @classmethod
    def from_c(cls, out: Any) -> SlotInfo:
        """Build from a filled ``shm_slot_info_t``, field by field by name."""
        values: dict[str, Any] = {f.name: int(getattr(out, f.name)) for f in fields(cls)}
        values["state"] = SlotState(values["state"])
        return cls(**values)


@dataclass(frozen=True)
class SlabStatistics:
    """Counters read from the slab's header in shared memory (a live snapshot).

    Each field is the ``shm_slab_stats_t`` field of the same name.
    """

    slots: int
    max_owners: int
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

    @classmethod
    def from_c(cls, out: Any) -> SlabStatistics:
        """Build from a filled ``shm_slab_stats_t``, field by field by name."""
        return cls(**{f.name: int(getattr(out, f.name)) for f in fields(cls)})
