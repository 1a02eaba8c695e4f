"""Turns: what a serving loop's real time is measured by.

A host brackets each turn of its loop (drain, step, deliver) with
:meth:`Turns.begin` and :meth:`Turns.end`. What a turn cost, against the rows
it stepped, feeds the cost model of :mod:`rte.realtime` (:class:`RealTime`:
how many sessions the pace holds, so admission refuses past it); a paced
turn's cost also feeds the overload governor (:mod:`rte.overload`), which
ranks the due sessions (:meth:`Turns.pick`) and whose notices (a class
reduced or restored) go out with the next step (:meth:`Turns.news`).

:class:`rte.serve.ServeLoop` holds one; it knows nothing of sessions' states
or requests, only of rows, seconds and the pace.
"""

from __future__ import annotations

import time

from rte.contract import Notice
from rte.overload import Governor
from rte.realtime import Pacer, RealTime

UNPACED_EVERY = 4  # an unpaced host fits its cost from every this-th turn that stepped


class Turns:
    """The turn clock, cost model, pacer and governor of one serving loop.

    Args:
        pace_hz: the host's pace (0: unpaced, no :attr:`pacer`).
        rows: the engine's rows (its manifest's ``max_sessions``).
        admission, margin: see :class:`rte.realtime.RealTime`.
    """

    def __init__(self, pace_hz: float, rows: int, admission: str, margin: float) -> None:
        self.realtime = RealTime(pace_hz, rows, admission, margin)
        self.pacer = Pacer(pace_hz) if pace_hz else None
        self.governor = Governor(pace_hz, self.realtime.budget_s, self._predict)
        self.stepped = 0  # rows stepped in this turn
        self.seconds = 0.0  # how long the last turn took
        self._due_rows = 0  # rows due in this turn before the governor's filter
        self._began = time.monotonic()
        self._news: list[Notice] = []  # the governor's notices, out with the next step
        # paced, every turn counts (admission and the governor rest on the fit); unpaced
        # the fit is only published, and a flat-out turn is short enough that the fit's
        # arithmetic is a few percent of it: a sample of the turns tells the same
        self._every = 1 if pace_hz else UNPACED_EVERY
        self._count = 0  # turns that stepped, for the sample

    def begin(self) -> None:
        """A turn begins (a paced one's tick: the pacer notes its lateness)."""
        self.stepped = self._due_rows = 0
        if self.pacer is not None:
            self.pacer.begin()
            self._began = self.pacer.turn_began
        else:
            self._began = time.monotonic()

    def end(self) -> None:
        """The turn is over: its cost feeds the model and, paced, the governor."""
        now = time.monotonic()
        seconds = self.seconds = now - self._began
        if self.stepped:
            self._count += 1
            if self._count % self._every == 0:
                self.realtime.cost.add(self.stepped, seconds, now)
        if self.pacer is not None and self._due_rows:
            self._news += self.governor.observe(seconds, self.stepped)

    def pick(self, due: list[str]) -> list[str]:
        """Of the ``due`` sessions, those the governor steps this turn (under
        overload, reduced classes step every k-th tick)."""
        self._due_rows += len(due)
        return self.governor.pick(due)

    def news(self) -> list[Notice]:
        """The governor's notices since the last call (they go out with a step)."""
        news, self._news = self._news, []
        return news

    def capacity(self) -> int | None:
        """Sessions the pace holds in real time (None: unpaced or not known yet)."""
        return self.realtime.capacity()

    def _predict(self, rows: int) -> float | None:
        cost = self.realtime.cost
        return cost.predict(rows) if cost.known else None
