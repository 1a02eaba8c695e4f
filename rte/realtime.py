"""Real time, measured: what a turn costs, how many sessions a pace holds, and the tick.

Three small objects that both hosts (:func:`rte.serve.default_serve` and the
daemon's :class:`~rte.ipc.core.DaemonCore`) use through their shared
:class:`~rte.serve.ServeLoop`, so that in process and daemon admit and pace
the same way:

- :class:`StepCost`, an online model of a host *turn* (drain the inbox, step,
  deliver: everything the period must hold) as a function of the rows stepped,
  ``t(n) = a + b*n``, fitted by exponentially weighted least squares: five
  running sums, O(1) per turn, no list of samples. A sample far above the
  prediction (a first step that compiles, a page fault storm) is clipped to
  :data:`CLIP` times the prediction (of the fit as it was at most
  :data:`CLIP_EVERY` turns ago: a refit costs more than the rest of the turn's
  bookkeeping) before it counts, so one outlier moves the fit by little. While
  the rows stepped barely vary (a steady cohort, or one whose count moves by
  less than a fifth of itself) the slope cannot be told
  from the intercept, so the fit goes through the origin, ``t(n) = (T/N)*n``:
  that over-estimates the cost of more rows, the safe side, and comes to the
  truth as the cohort nears the capacity.
  Until :data:`MIN_SAMPLES` turns are seen it knows nothing and says so.
- :class:`RealTime`, the admission rule of a paced host: the capacity is the
  largest ``n`` whose predicted turn fits ``period x (1 - margin)``, capped by
  the engine's rows; an attach past it is refused with the figures (``rows``
  admission, or an unpaced host, keeps only the rows limit).
- :class:`Pacer`, the tick: sleep until just before it, then spin (bounded) so
  the turn starts on time (a sleeping core wakes late: how early it wakes is
  learned from how late its naps woke, :mod:`rte.lateness`); a host that fell behind
  starts the next tick now and never catches up in a burst. Each tick's
  lateness is kept (:class:`PacerStats`) for the figures.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from rte.errors import AdmissionError
from rte.lateness import Lateness

FORGET = 0.98  # each turn's weight decays by this per later turn (a window of ~50 turns)
MIN_SAMPLES = 8  # turns seen before the model claims to know anything
RECENT = 0.8  # the recent turn's weight decays by this per turn (the last few turns)
RECENT_FOR_S = 0.5  # ... and says nothing once no turn has stepped a row for this long
CLIP = 3.0  # a sample is counted as at most this many times its prediction
CLIP_EVERY = 8  # ... the prediction of a fit this many turns old at most (not refitted each turn)
MIN_SPREAD_ROWS = 1.0  # below this weighted spread of n, fit through the origin
MIN_RELATIVE_SPREAD = 0.2  # ... or below this share of the mean n (its standard deviation)
SPIN_S = 0.0005  # a paced host spins at least this long before each tick
SPIN_CAP_NS = 2_000_000  # ... and at most this long, however late its naps wake
ADMISSIONS = ("realtime", "rows")
DEFAULT_MARGIN = 0.1


class StepCost:
    """The online fit ``t(n) = a + b*n`` of a turn's seconds by its rows."""

    __slots__ = (
        "_clip",
        "_n",
        "_nn",
        "_nt",
        "_recent_at",
        "_t",
        "_tt",
        "_w",
        "recent_s",
        "samples",
    )

    def __init__(self) -> None:
        self._w = self._n = self._nn = self._t = self._nt = self._tt = 0.0
        self.samples = 0
        self.recent_s = 0.0  # the last few turns' seconds, as they were (not clipped)
        self._recent_at = 0.0  # when the last of them was counted
        self._clip = (0.0, 0.0)  # (a, b) the clip predicts by, refitted every CLIP_EVERY

    def add(self, rows: int, seconds: float, now: float | None = None) -> None:
        """Count one turn that stepped ``rows`` rows in ``seconds`` (ending at ``now``,
        ``time.monotonic()``, when the caller has it)."""
        if rows <= 0 or not seconds >= 0:
            return
        self.recent_s = RECENT * self.recent_s + (1.0 - RECENT) * seconds
        self._recent_at = time.monotonic() if now is None else now
        if self.samples >= MIN_SAMPLES:
            if not self.samples % CLIP_EVERY or self.samples == MIN_SAMPLES:
                self._clip = self.coefficients()
            a, b = self._clip
            seconds = min(seconds, CLIP * (a + b * rows))
        f = FORGET
        self._w = self._w * f + 1.0
        self._n = self._n * f + rows
        self._nn = self._nn * f + rows * rows
        self._t = self._t * f + seconds
        self._nt = self._nt * f + rows * seconds
        self._tt = self._tt * f + seconds * seconds
        self.samples += 1

    def recent(self) -> float:
        """The last few turns' seconds; 0 once no turn has stepped a row for a while
        (a drained cohort's last turns say nothing about the next one)."""
        fresh = time.monotonic() - self._recent_at < RECENT_FOR_S
        return self.recent_s if fresh else 0.0

    @property
    def known(self) -> bool:
        return self.samples >= MIN_SAMPLES

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)``: seconds per turn and per row (0, 0 until known)."""
        if not self.samples:
            return 0.0, 0.0
        w, n, nn, t, nt = self._w, self._n, self._nn, self._t, self._nt
        spread = nn / w - (n / w) ** 2  # the weighted variance of n
        # a slope is told from the intercept only over rows that vary by a good share
        # of their mean: over 28..31 rows, turn-time noise makes it anything, and a
        # slope too small promises a capacity several times the truth
        if spread >= max(MIN_SPREAD_ROWS, (MIN_RELATIVE_SPREAD * n / w) ** 2):
            b = (w * nt - n * t) / (w * nn - n * n)
            a = (t - b * n) / w
            if a >= 0 and b > 0:
                return a, b
        return 0.0, t / n  # through the origin: the safe side for more rows

    def predict(self, rows: int) -> float:
        """The predicted seconds of a turn of ``rows`` rows."""
        a, b = self.coefficients()
        return a + b * rows

    def capacity(self, budget_s: float) -> int | None:
        """The most rows whose turn fits ``budget_s`` on the pessimistic side of
        the fit; None while unknown.

        The capacity is an extrapolation, so it takes the slope at the top of its
        uncertainty (two standard errors, from the residuals), through the mean
        turn: a clean line gives the line's answer, while a slope fitted to noisy
        turns of bursty arrivals, which comes out low as often as high, no longer
        promises sessions past the knee (seen: 68 admitted for a knee of 56).
        Through the origin (rows that barely vary) it is the safe side already.
        """
        if not self.known:
            return None
        a, b = self.coefficients()
        if b <= 0:
            return None
        if a > 0:  # a fitted line: steepen it by its uncertainty, through the mean
            w, n, t = self._w, self._n, self._t
            sxx = self._nn - n * n / w
            residual = max(0.0, self._tt - t * t / w - b * (self._nt - n * t / w))
            if sxx > 0 and w > 2:
                b += 2.0 * math.sqrt(residual / (w - 2) / sxx)
                a = max(0.0, t / w - b * n / w)
        return max(0, math.floor((budget_s - a) / b + 1e-9))  # (no rounding down 30 to 29)


class RealTime:
    """The admission rule of one host: rows always, real time when paced.

    Args:
        pace_hz: the host's pace (0: unpaced: admission by rows only).
        rows: the engine's rows (``manifest.max_sessions``): a cap on capacity.
        admission: ``realtime`` (refuse what the pace cannot hold) or ``rows``.
        margin: the share of the period kept free (0.1: a turn may take 90%).
    """

    def __init__(
        self,
        pace_hz: float,
        rows: int,
        admission: str = "realtime",
        margin: float = DEFAULT_MARGIN,
    ) -> None:
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {', '.join(ADMISSIONS)}, not {admission!r}")
        if not 0 <= margin < 1:
            raise ValueError(f"the real-time margin must be 0 to 1 (a share), got {margin}")
        self.pace_hz = float(pace_hz or 0.0)
        self.period_s = 1.0 / self.pace_hz if self.pace_hz else 0.0
        self.rows = rows
        self.admission = admission
        self.margin = margin
        self.cost = StepCost()

    @property
    def budget_s(self) -> float:
        """What one turn may take: the period less the margin (0 unpaced)."""
        return self.period_s * (1.0 - self.margin)

    def capacity(self) -> int | None:
        """Sessions the pace holds (capped by the rows); None unpaced or while unknown."""
        if not self.period_s:
            return None
        fits = self.cost.capacity(self.budget_s)
        return None if fits is None else min(fits, self.rows)

    def admit(self, attached: int) -> None:
        """Raise AdmissionError when one more session than ``attached`` would push
        the predicted turn past the period (real-time admission, paced, known)."""
        if self.admission != "realtime":
            return
        capacity = self.capacity()
        if capacity is not None and self.cost.recent() > self.budget_s:
            # the turns already run long, whatever the model says (a neighbour takes
            # the cores, the cost grew faster than linearly): nobody more for now
            capacity = min(capacity, attached)
        if capacity is not None and attached + 1 > capacity:
            raise AdmissionError(
                f"real-time capacity {capacity} sessions at {self.pace_hz:g} Hz reached "
                f"({attached} attached): one more would push the step past its period; "
                "retry later, attach elsewhere, or lower --pace-hz"
            )


@dataclass(frozen=True)
class PacerStats:
    """What a pacer has seen: ticks run, ticks begun late, ticks skipped (fell behind),
    the last tick's lateness and the largest, in seconds."""

    ticks: int
    late: int
    missed: int
    last_lateness_s: float
    max_lateness_s: float


class Pacer:
    """The tick of a paced host: :meth:`begin` a turn, then :meth:`wait` for the next.

    A tick is late when its turn begins more than half a period after it was
    due; a turn that ran past the next tick has missed it (the tick after is
    counted from now).
    """

    def __init__(self, pace_hz: float, *, spin_s: float = SPIN_S) -> None:
        if not pace_hz > 0:
            raise ValueError(f"a pacer needs a pace above 0 Hz, got {pace_hz}")
        self.period_s = 1.0 / pace_hz
        self.spin_s = spin_s
        self.wake = Lateness(round(spin_s * 1e9), max(SPIN_CAP_NS, round(spin_s * 1e9)))
        self.tick = time.monotonic()  # when the current turn was due
        self.turn_began = self.tick
        self.ticks = self.late = self.missed = 0
        self.lateness_s = self.max_lateness_s = 0.0

    @property
    def next_tick(self) -> float:
        return self.tick + self.period_s

    def begin(self) -> float:
        """A turn begins (now); returns its lateness in seconds."""
        now = self.turn_began = time.monotonic()
        lateness = self.lateness_s = max(0.0, now - self.tick)
        self.ticks += 1
        if lateness > self.period_s / 2:
            self.late += 1
        self.max_lateness_s = max(self.max_lateness_s, lateness)
        return lateness

    def turn_s(self) -> float:
        """Seconds since the current turn began."""
        return time.monotonic() - self.turn_began

    def wait(self, sleep: Callable[[float], object] = time.sleep) -> None:
        """Until the next tick: ``sleep`` until just before it, then spin. A host
        past it already starts the next turn now (no burst to catch up)."""
        self.tick += self.period_s
        now = time.monotonic()
        if now >= self.tick:
            self.missed += 1
            self.tick = now
            return
        nap = self.tick - self.wake.margin_ns() / 1e9 - now
        if nap > 0:
            if sleep(nap):  # a sleep that returns True was cut short: stop
                return
            self.wake.saw(round((time.monotonic() - now - nap) * 1e9))  # (how late it woke)
        while time.monotonic() < self.tick:  # bounded: at most the margin past a nap
            pass

    def stats(self) -> PacerStats:
        return PacerStats(self.ticks, self.late, self.missed, self.lateness_s, self.max_lateness_s)
