"""A client's wait around a paced daemon's tick: asleep until just before it, then
spinning until the step's record lands, so that no post has to wake it.

The daemon publishes its next tick (:attr:`Control.next_tick_ns
<rte.protocol.control.Control.next_tick_ns>`); a caught record costs the spin
~1 µs, one that lands while the client sleeps a wake-up by post (~300 µs on a
small VM). How early to wake and how long to spin past the tick are learned
(:class:`~rte.lateness.Lateness`) from how late this client's naps woke (it wakes
that early: the record lands after the tick, which covers a wake later still) and
how long after its tick each record came: on a busy box a fixed 0.3 ms lead and
1 ms spin missed a third to a half of the records at load 3 on two cores (the
daemon's turn itself began late). Both stay within :data:`TICK_CAP_NS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rte.lateness import Lateness
from shm import Ring, WaitPolicy

TICK_LEAD_NS = 300_000  # wake at least this long before the tick, then spin
TICK_SPIN_NS = 1_000_000  # ... and spin at least this long past it before sleeping again
TICK_CAP_NS = 3_000_000  # (each learned from recent ticks: at most this)
IDLE_TICKS = 2  # ticks in a row whose spin caught nothing: then it sleeps until one comes
WOKE_TIMES = 1.0  # the lead: this many times how late naps wake (~their 90th percentile)


class TickWait:
    """One client's waits around its daemon's ticks, and what they learned."""

    def __init__(self) -> None:
        # how late its naps woke: woken that early, once the estimate (~90th percentile),
        # not twice (the record lands after the tick, which covers a later wake): at 60 Hz,
        # 1 session, 9-10% of a core where twice spun 13-14%, held p50/p99 the same
        self.woke = Lateness(TICK_LEAD_NS, TICK_CAP_NS, times=WOKE_TIMES)
        self.landed = Lateness(TICK_SPIN_NS, TICK_CAP_NS)  # a record after its tick
        self.idle = 0  # ticks in a row that brought this client nothing (no credit left)

    def wait(self, ring: Ring, check: Callable[[], None], tick: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a record of ``ring``, the next due at ``tick``
        (monotonic ns): asleep until the learned lead before it, spinning until the
        learned time past it, then asleep again."""
        if self.idle >= IDLE_TICKS:  # nothing is coming at each tick: no spin for it
            if ring.wait_readable(timeout, check):
                self.idle = 0
                return True
            return False
        deadline = time.monotonic() + timeout
        now, wake_at = time.monotonic_ns(), tick - self.woke.margin_ns()
        if wake_at > now:
            nap = min(timeout, (wake_at - now) / 1e9)
            if ring.wait_readable(nap, check, WaitPolicy.BLOCK):
                return self._landed(tick)
            self.woke.saw(time.monotonic_ns() - wake_at)
        past = (tick + self.landed.margin_ns() - time.monotonic_ns()) / 1e9
        spin = min(deadline - time.monotonic(), past)
        if spin > 0 and ring.wait_readable(spin, check, WaitPolicy.SPIN):
            return self._landed(tick)
        if ring.wait_readable(max(deadline - time.monotonic(), 0.0), check):
            return self._landed(tick)
        self.idle += time.monotonic_ns() > tick + self.landed.margin_ns()  # (a whole window)
        return False

    def _landed(self, tick: int) -> bool:
        """A record came while waiting for ``tick``'s: learn how long after it (not
        a later tick's: a session stepped every k-th tick, a daemon that missed one)."""
        self.idle = 0
        late = time.monotonic_ns() - tick
        if late <= 2 * TICK_CAP_NS:
            self.landed.saw(late)
        return True
