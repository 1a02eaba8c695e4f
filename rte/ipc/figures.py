"""Each session's real-time figures, kept where an inspector can read them.

What a user of a session feels, counted by the daemon as it serves (single
writer: the serve thread) into arrays an inspector maps read-only:

- **time to first chunk**: its ATTACHED to its first chunk emitted;
- **chunks on time**: a chunk's *tick* is one period after its session's
  previous chunk; it is on time when it is emitted no later than half a
  period after that tick (its gap is at most 1.5 periods). The first chunk is
  on time. The share is on-time chunks over the periods that passed since the
  first chunk (``owed``), so a session stepped at half its rate has 50% at
  best. Unpaced, every chunk is on time (there is no tick to miss);
- **inter-arrival**: the gaps between its chunks, as a histogram
  (:mod:`rte.protocol.latency` buckets: p50 and p99 are read from it), and the
  **longest stall** (its longest gap, less one period);
- **input to photon**: an action received to the first chunk emitted whose
  receipt (``applied``) is at least its ``seq``; the oldest action not yet
  applied is the one timed, so it costs two words a session;
- **reductions**: how often the overload governor lowered its rate;
- **parked**: the bytes of its state while it is parked (:mod:`rte.parking`).

The arrays are per client slot and session handle, ``(handles, WORDS)``
words plus two ``(handles, BUCKETS)`` histograms and the session's name. A
step's update is kept, not counted: the steps kept are counted together (in
the NumPy calls of one update, whatever the number of steps and rows) after
``FLUSH_STEPS`` steps or ``FLUSH_NS``, when the daemon is about to wait, and
before anything else touches the figures. Counted a step at a time they were a
quarter of a flat-out daemon's time (as much as the engine's step; py-spy); an
inspector sees them at most ``FLUSH_NS`` late. A handle's figures stay
readable after its session left, until the handle is bound again.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from rte.protocol import latency
from rte.protocol.control import Control, RealTimeWord
from rte.serve import ServeLoop
from shm.counting import FigureCounter

NAME_BYTES = 64  # a session's name as shown (longer ones are cut)
ON_TIME_PERIODS = 1.5
# steps kept before they are counted, at most: a flush's cost is nearly all NumPy
# calls, whatever the steps (32 steps of one handle 201 us, 128 209 us; of 64 handles
# 360 and 389 us, on the 2-core box), so FLUSH_NS is what bounds it, flat out too
FLUSH_STEPS = 128
FLUSH_NS = 20_000_000  # and for at most this long (an idle daemon counts them at once)


class Word(enum.IntEnum):
    """The figures of one session handle, one int64 word each."""

    LIVE = 0  # 1 while the session is bound to the handle
    ATTACHED_NS = 1
    FIRST_NS = 2  # its first chunk's emission (0: none yet)
    LAST_NS = 3
    CHUNKS = 4
    ON_TIME = 5
    LONGEST_GAP_NS = 6
    REDUCTIONS = 7
    PENDING_SEQ = 8  # the oldest action not yet seen applied (0: none)
    PENDING_NS = 9  # when it was received
    PHOTONS = 10  # actions timed to their photon
    PERIOD_NS = 11  # the pace the figures were counted at (0: unpaced)
    PARKED_BYTES = 12  # its state's bytes while parked (rte.parking; 0: in a row)


WORDS = 16  # room to grow without moving the histograms


def size(handles: int) -> int:
    """Bytes of one client's figures."""
    return handles * (8 * WORDS + 2 * 8 * latency.BUCKETS + NAME_BYTES)


class SessionFigures:
    """One client slot's figures over ``buffer`` (``size(handles)`` bytes)."""

    def __init__(self, buffer: Any, handles: int, period_ns: int, readonly: bool = False) -> None:
        words_end = handles * 8 * WORDS
        gaps_end = words_end + handles * 8 * latency.BUCKETS
        photon_end = gaps_end + handles * 8 * latency.BUCKETS
        raw = np.frombuffer(buffer, np.uint8, count=size(handles))
        self.words = raw[:words_end].view(np.int64).reshape(handles, WORDS)
        self.gaps = raw[words_end:gaps_end].view(np.int64).reshape(handles, latency.BUCKETS)
        self.photons = raw[gaps_end:photon_end].view(np.int64).reshape(handles, latency.BUCKETS)
        self.names = raw[photon_end:].reshape(handles, NAME_BYTES)
        if readonly:
            for a in (self.words, self.gaps, self.photons, self.names):
                a.flags.writeable = False
        self.period_ns = period_ns
        self._late_ns = int(period_ns * ON_TIME_PERIODS) if period_ns else 1 << 62
        self._steps: list[tuple[np.ndarray[Any, Any], int, list[int] | None]] = []
        self._since_ns = 0  # when the oldest step kept was emitted
        # actions received while steps are kept: (steps kept before it, handle, seq, ns)
        self._acts: list[tuple[int, int, int, int]] = []
        self._counter: FigureCounter | None = None  # the C's view, for a writer
        if not readonly:
            self._counter = FigureCounter(self.words, self.gaps, self.photons, self._late_ns)

    # -- the writer (the daemon's serve thread) ---------------------------------

    def clear(self) -> None:
        """Forget every handle's figures (a new client in the slot)."""
        self.flush()
        for a in (self.words, self.gaps, self.photons, self.names):
            a[...] = 0

    def bound(self, handle: int, session: str, now_ns: int) -> None:
        """``session`` took ``handle`` (ATTACHED): its figures start afresh."""
        self.flush()
        self.words[handle] = 0
        self.gaps[handle] = 0
        self.photons[handle] = 0
        name = session.encode("utf-8", "replace")[:NAME_BYTES]
        self.names[handle] = 0
        self.names[handle, : len(name)] = np.frombuffer(name, np.uint8)
        row = self.words[handle]
        row[Word.ATTACHED_NS] = now_ns
        row[Word.PERIOD_NS] = self.period_ns
        row[Word.LIVE] = 1

    def unbound(self, handle: int) -> None:
        self.flush()
        self.words[handle, Word.LIVE] = 0

    def emitted(
        self, handles: np.ndarray[Any, Any], now_ns: int, applied: list[int] | None = None
    ) -> None:
        """A step emitted one chunk to each of ``handles`` (distinct) at ``now_ns``;
        ``applied``: their receipts (None: no session has acted). Kept, and counted
        with the next steps' (:meth:`flush`)."""
        pending = self._steps
        if not pending:
            self._since_ns = now_ns
        pending.append((handles, now_ns, applied))
        if len(pending) >= FLUSH_STEPS or now_ns - self._since_ns >= FLUSH_NS:
            self.flush()

    def counted(self) -> Any:
        """The C's view of these figures (``shm_figures_t *``) for a writer that
        counts each step as it sends it (``shm_rows_send``, a step's chunks at
        once, in the order sent), the steps kept for NumPy counted first, so the
        two never count out of order."""
        self.flush()
        assert self._counter is not None, "read-only figures are never counted"
        return self._counter.c

    def count(self, handles: Any, now_ns: int, applied: Any = None) -> None:
        """A step's chunks counted at once in C (``shm_figures_count``), as the
        in-place writer counts the steps it sends (the daemon's other sends, and
        tests/test_figures.py's C side): ``handles`` and ``applied`` (``uint32``
        buffers; None: no receipts), what :meth:`emitted` keeps for NumPy."""
        self.flush()
        assert self._counter is not None, "read-only figures are never counted"
        self._counter.count(handles, now_ns, applied)

    def flush_stale(self, now_ns: int) -> None:
        """:meth:`flush` if the oldest step kept is older than ``FLUSH_NS``."""
        if self._steps and now_ns - self._since_ns >= FLUSH_NS:
            self.flush()

    def flush(self) -> None:
        """Count the steps kept since the last flush, all at once: the figures then
        are those of one update per step, in order (tests/test_figures.py holds the
        two equal), for about the NumPy calls of one."""
        steps, self._steps = self._steps, []
        acts, self._acts = self._acts, []
        if not steps:
            for _, handle, seq, now_ns in acts:
                self._pend(handle, seq, now_ns)
            return
        w = self.words
        sizes = [len(h) for h, _, _ in steps]
        handles = np.concatenate([h for h, _, _ in steps]).astype(np.intp, copy=False)
        times = np.repeat(np.array([t for _, t, _ in steps], np.int64), sizes)
        order = np.argsort(handles, kind="stable")  # each handle's chunks, in time order
        h, t = handles[order], times[order]
        starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
        ends = np.r_[starts[1:], len(h)] - 1
        ones = h[starts]  # each handle once
        before = t.copy()  # each chunk's previous emission
        before[1:] = t[:-1]
        before[starts] = w[ones, Word.LAST_NS]
        first = before == 0  # its session's first chunk ever (only ever at a start)
        gaps = np.where(first, 0, t - before)
        on_time = (gaps <= self._late_ns).astype(np.int64)
        w[ones, Word.ON_TIME] += np.add.reduceat(on_time, starts)
        longest = np.maximum.reduceat(gaps, starts)
        w[ones, Word.LONGEST_GAP_NS] = np.maximum(w[ones, Word.LONGEST_GAP_NS], longest)
        w[ones, Word.CHUNKS] += ends - starts + 1
        w[h[first], Word.FIRST_NS] = t[first]
        w[ones, Word.LAST_NS] = t[ends]
        later = ~first
        if later.any():
            np.add.at(self.gaps, (h[later], _buckets(gaps[later])), 1)
        if not acts and all(a is None for _, _, a in steps):
            return
        seqs = np.concatenate(
            [
                np.full(n, -1, np.int64) if a is None else np.asarray(a, np.int64)
                for n, (_, _, a) in zip(sizes, steps, strict=True)
            ]
        )[order]
        if not acts:
            self._photons(h, t, seqs)
            return
        acting = np.array(sorted({handle for _, handle, _, _ in acts}), np.intp)
        others = ~np.isin(h, acting)
        if others.any():
            self._photons(h[others], t[others], seqs[others])
        step_of = np.repeat(np.arange(len(steps)), sizes)[order]
        self._photons_in_order(acting, acts, h, t, seqs, step_of)

    def _photons_in_order(
        self,
        acting: np.ndarray[Any, Any],
        acts: list[tuple[int, int, int, int]],
        h: np.ndarray[Any, Any],
        t: np.ndarray[Any, Any],
        seqs: np.ndarray[Any, Any],
        step_of: np.ndarray[Any, Any],
    ) -> None:
        """The photons of the handles that acted while steps were kept: their chunks
        (``h`` sorted, in time order per handle; ``step_of`` each one's step) and
        actions taken in the order they came, one handle at a time in Python (a few
        rows each, where the NumPy calls of an update cost tens of us)."""
        lows = np.searchsorted(h, acting, "left").tolist()
        highs = np.searchsorted(h, acting, "right").tolist()
        for handle, lo, hi in zip(acting.tolist(), lows, highs, strict=True):
            its = [(at, seq, ns) for at, a, seq, ns in acts if a == handle]
            row = self.words[handle]
            pending, since = int(row[Word.PENDING_SEQ]), int(row[Word.PENDING_NS])
            j = 0
            rows = (step_of[lo:hi].tolist(), t[lo:hi].tolist(), seqs[lo:hi].tolist())
            chunks = zip(*rows, strict=True)
            for step, emitted_ns, seq in chunks:
                while j < len(its) and its[j][0] <= step:  # actions before this step
                    if pending == 0:
                        pending, since = its[j][1], its[j][2]
                    j += 1
                if pending > 0 and seq >= pending:
                    self.photons[handle, latency.bucket(emitted_ns - since)] += 1
                    row[Word.PHOTONS] += 1
                    pending = 0
            for _, seq, ns in its[j:]:  # after the last step kept
                if pending == 0:
                    pending, since = seq, ns
            row[Word.PENDING_SEQ], row[Word.PENDING_NS] = pending, since

    def _photons(self, h: np.ndarray[Any, Any], t: np.ndarray[Any, Any], seqs: Any) -> None:
        """The chunks (handle ``h``, emitted at ``t``, in order per handle) carry receipts
        ``seqs``: each handle's first that applies its pending action times it."""
        pending = self.words[h, Word.PENDING_SEQ]
        done = np.flatnonzero((pending > 0) & (seqs >= pending))
        if not len(done):
            return
        done = done[np.r_[True, h[done][1:] != h[done][:-1]]]  # the first per handle
        which = h[done]
        waited = t[done] - self.words[which, Word.PENDING_NS]
        np.add.at(self.photons, (which, _buckets(waited)), 1)
        self.words[which, Word.PHOTONS] += 1
        self.words[which, Word.PENDING_SEQ] = 0

    def acted(self, handle: int, seq: int, now_ns: int) -> None:
        """An action ``seq`` of the session was received (timed if none is pending).
        Kept, in order with the steps kept (a flush for each action was a quarter
        of a flat daemon's time when its client acted every few steps; py-spy)."""
        if not self._steps:
            self._pend(handle, seq, now_ns)
            return
        self._acts.append((len(self._steps), handle, seq, now_ns))
        if len(self._acts) >= FLUSH_STEPS:
            self.flush()

    def _pend(self, handle: int, seq: int, now_ns: int) -> None:
        row = self.words[handle]
        if row[Word.PENDING_SEQ] == 0:
            row[Word.PENDING_SEQ] = seq
            row[Word.PENDING_NS] = now_ns

    def applied(self, handles: np.ndarray[Any, Any], seqs: np.ndarray[Any, Any], now: int) -> None:
        """Chunks emitted at ``now`` to ``handles`` carry receipts ``seqs``."""
        self.flush()
        h = np.asarray(handles, np.intp)
        self._photons(h, np.full(len(h), now, np.int64), np.asarray(seqs, np.int64))

    def reduced(self, handle: int) -> None:
        self.flush()
        self.words[handle, Word.REDUCTIONS] += 1

    def parked(self, bytes_by_handle: dict[int, int]) -> None:
        """Each bound handle's parked bytes (those not named: in a row)."""
        self.flush()
        column = self.words[:, Word.PARKED_BYTES]
        column[...] = 0
        for handle, nbytes in bytes_by_handle.items():
            column[handle] = nbytes

    # -- the readers ------------------------------------------------------------

    def session(self, handle: int, now_ns: int) -> dict[str, Any]:
        """One handle's figures as a plain dict (for ``rte inspect --json``)."""
        self.flush()
        row = [int(v) for v in self.words[handle]]
        name = bytes(self.names[handle]).rstrip(b"\0").decode("utf-8", "replace")
        period = row[Word.PERIOD_NS]
        first, last, chunks = row[Word.FIRST_NS], row[Word.LAST_NS], row[Word.CHUNKS]
        end = now_ns if row[Word.LIVE] else last
        owed = 1 + (end - first) // period if period and first else chunks
        gaps = latency.percentiles_us(self.gaps[handle].astype(np.int64), (50, 99))
        photon = latency.percentiles_us(self.photons[handle].astype(np.int64), (50, 95))
        longest = max(0, row[Word.LONGEST_GAP_NS] - period) if chunks > 1 else 0
        return {
            "session": name,
            "live": bool(row[Word.LIVE]),
            "chunks": chunks,
            "ttfc_ms": (first - row[Word.ATTACHED_NS]) / 1e6 if first else None,
            "on_time_pct": 100.0 * min(1.0, row[Word.ON_TIME] / owed) if owed else None,
            "gap_p50_ms": gaps[0] / 1e3 if gaps else None,
            "gap_p99_ms": gaps[1] / 1e3 if gaps else None,
            "longest_stall_ms": longest / 1e6,
            "photon_p50_ms": photon[0] / 1e3 if photon else None,
            "photon_p95_ms": photon[1] / 1e3 if photon else None,
            "reductions": row[Word.REDUCTIONS],
            "parked_bytes": row[Word.PARKED_BYTES],
        }

    def sessions(self, now_ns: int) -> list[dict[str, Any]]:
        """Every handle that has served a session (live ones first)."""
        used = np.flatnonzero(self.words[:, Word.ATTACHED_NS] > 0)
        out = [self.session(int(h), now_ns) for h in used]
        return sorted(out, key=lambda s: not s["live"])


def publish_realtime(control: Control, loop: ServeLoop, pace_hz: float) -> None:
    """What the serve loop knows of real time (capacity, cost, late ticks), into
    the daemon's control block (:class:`~rte.protocol.control.RealTimeWord`)."""
    pacer = loop.pacer
    capacity = loop.capacity()
    a, b = loop.realtime.cost.coefficients()
    control.publish_realtime(
        {
            RealTimeWord.CAPACITY: 0 if capacity is None else capacity + 1,
            RealTimeWord.PACE_MHZ: round(pace_hz * 1000),
            RealTimeWord.ATTACHED: len(loop.conditioning),
            RealTimeWord.REDUCED: loop.governor.reduced(),
            RealTimeWord.COST_A_NS: round(a * 1e9),
            RealTimeWord.COST_B_NS: round(b * 1e9),
            RealTimeWord.TICKS_LATE: pacer.late if pacer is not None else 0,
            RealTimeWord.TICKS_MISSED: pacer.missed if pacer is not None else 0,
            RealTimeWord.ADMISSION: 1 if loop.realtime.admission == "realtime" else 2,
            RealTimeWord.MARGIN_PERMILLE: round(loop.realtime.margin * 1000),
        }
    )


def _buckets(ns: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """:func:`rte.protocol.latency.bucket` over an int64 array, in a few NumPy calls."""
    ns = np.maximum(np.asarray(ns, np.int64), 1)
    bits = np.frexp(ns.astype(np.float64))[1].astype(np.int64)  # bit_length, exact below 2**53
    sub = (ns >> np.maximum(bits - 3, 0)) & (latency.SUB - 1)
    index = latency.SUB * (bits - latency.LOW_BITS) + sub
    index[bits <= latency.LOW_BITS] = 0
    return np.minimum(index, latency.BUCKETS - 1)
