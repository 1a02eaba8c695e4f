"""How late a timed thing comes, learned: the margin a paced wait wakes early by.

A paced daemon sleeps until just before each tick and spins the rest, so its
turn starts on time; a client of it sleeps until just before the tick and
spins until the step's record lands, so no post has to wake it (a wake-up by
post costs ~300 µs on a small VM, a spin that catches the record ~1 µs). Both
need to know how late things come: how late a sleep wakes (a timer's slack,
and a busy box's wait for a core: a fixed 0.3-0.5 ms is too little at load 3
on two cores) and, for the client, how long after the tick the record lands
(the daemon's own lateness and its turn). :class:`Lateness` learns a high
quantile of such a delay from what each wait saw: a sample above the estimate
pulls it up by half the gap, one below lets it down by a sixteenth, so it sits
near the 90th percentile of the recent samples and recovers in a few dozen
ticks once the box is quiet. The margin it gives is bounded both ways: at
least ``floor_ns`` (what a quiet box needs), at most ``cap_ns`` (a spin that
long per tick is all it may cost).
"""

from __future__ import annotations

UP = 0.5  # a sample above the estimate closes this share of the gap
DOWN = 1 / 16  # one below, this share (a slow decay: the estimate keeps the tail)


class Lateness:
    """A high quantile of a delay in ns, learned sample by sample; :meth:`margin_ns`
    the wait's margin from it (``times`` the estimate, default twice, within
    ``floor_ns``..``cap_ns``)."""

    __slots__ = ("cap_ns", "estimate_ns", "floor_ns", "times")

    def __init__(self, floor_ns: int, cap_ns: int, times: float = 2.0) -> None:
        if not 0 <= floor_ns <= cap_ns:
            raise ValueError(f"a margin needs 0 <= floor <= cap, got {floor_ns}, {cap_ns}")
        if not times > 0:
            raise ValueError(f"a margin is a positive multiple of the estimate, got {times}")
        self.floor_ns, self.cap_ns, self.times = floor_ns, cap_ns, times
        self.estimate_ns = 0.0

    def saw(self, late_ns: int) -> None:
        """One delay (a sleep that woke ``late_ns`` after it was due; negative: early)."""
        sample = float(max(0, min(late_ns, 4 * self.cap_ns)))  # (one stall never sticks)
        gap = sample - self.estimate_ns
        self.estimate_ns += gap * (UP if gap > 0 else DOWN)

    def margin_ns(self) -> int:
        """How early to wake (or how long to spin past) for what was seen."""
        return int(min(self.cap_ns, max(self.floor_ns, self.times * self.estimate_ns)))
