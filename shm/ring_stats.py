"""RingStatistics: a ring's counters, read from its header as one snapshot.

:meth:`shm.Ring.statistics` fills a ``shm_ring_stats_t`` in one C call; this
turns it into a value (``rte inspect`` prints it, the benchmarks diff two).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# RingStatistics fields that are not read as the C field of the same name
_DERIVED = frozenset({"used_bytes", "high_water_bytes", "consumer_sleeping"})


@dataclass(frozen=True)
class RingStatistics:
    """Counters read from the ring's header in shared memory (a live snapshot).

    Each field is the ``shm_ring_stats_t`` field of the same name, except the
    three that :meth:`from_c` derives: ``used_bytes`` (head - tail),
    ``high_water_bytes`` (``high_water``) and ``consumer_sleeping``
    (``sleeping``).
    """

    capacity: int
    used_bytes: int
    high_water_bytes: int
    pushed: int
    popped: int
    bytes_pushed: int
    bytes_popped: int
    full_events: int
    oversized: int
    corrupt: int
    wakeups: int
    consumer_sleeping: bool

    @property
    def waiting(self) -> int:
        """Records pushed and not yet popped."""
        return self.pushed - self.popped

    @classmethod
    def from_c(cls, out: Any) -> RingStatistics:
        """Build from a filled ``shm_ring_stats_t``, field by field by name."""
        named: dict[str, Any] = {
            f.name: int(getattr(out, f.name)) for f in fields(cls) if f.name not in _DERIVED
        }
        return cls(
            **named,
            used_bytes=int(out.head - out.tail),
            high_water_bytes=int(out.high_water),
            consumer_sleeping=bool(out.sleeping),
        )
