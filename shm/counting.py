"""Counts kept in a caller's own arrays, done in C over them in one call.

- :class:`CreditJudge` — which handles may have one more chunk out: fewer
  emitted than their consumer's count (a word in shared memory the consumer
  writes, read with acquire) plus their credits (``shm_with_credit``).
- :class:`FigureCounter` — each handle's real-time figures (words and two
  log-bucket histograms) counted for a step's rows at once
  (``shm_figures_count``); its :attr:`~FigureCounter.c` is what a
  :class:`~shm.steps.RowsWriter` counts through as it pushes each record.

The arrays are the caller's (its layout, its reference in NumPy); these only
hold C views of them, so the arrays must outlive the object, as they do when
the caller owns both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shm.native import ffi, lib


class CreditJudge:
    """``due[h] = bound[h] and emitted[h] - consumed[h] < credits[h]`` for every handle."""

    def __init__(
        self,
        emitted: np.ndarray[Any, Any],
        consumed: np.ndarray[Any, Any],
        credits: np.ndarray[Any, Any],
        bound: np.ndarray[Any, Any],
        due: np.ndarray[Any, Any],
    ) -> None:
        n = len(emitted)
        if not len(consumed) == len(credits) == len(bound) == len(due) == n:
            raise ValueError("a credit judge's arrays are one word (or byte) per handle each")
        self._args = (
            ffi.from_buffer("int64_t[]", emitted),
            ffi.from_buffer("uint64_t[]", consumed),
            ffi.from_buffer("int64_t[]", credits),
            ffi.from_buffer("uint8_t[]", bound),
            ffi.from_buffer("uint8_t[]", due),
            n,
        )

    def __call__(self) -> int:
        """Judge every handle into ``due``; how many are due."""
        return int(lib.shm_with_credit(*self._args))


class FigureCounter:
    """The C's view (``shm_figures_t``) of ``handles`` handles' figures:
    ``words`` ``(handles, nwords)``, ``gaps`` and ``photons`` ``(handles,
    buckets)``, all int64; a gap above ``late_ns`` is late."""

    def __init__(
        self,
        words: np.ndarray[Any, Any],
        gaps: np.ndarray[Any, Any],
        photons: np.ndarray[Any, Any],
        late_ns: int,
    ) -> None:
        handles, nwords = words.shape
        if gaps.shape != photons.shape or gaps.shape[0] != handles:
            raise ValueError("the figures' histograms are one row per handle, one shape")
        c = ffi.new("shm_figures_t *")
        c.words = ffi.from_buffer("int64_t[]", words)
        c.gaps = ffi.from_buffer("int64_t[]", gaps)
        c.photons = ffi.from_buffer("int64_t[]", photons)
        c.handles, c.nwords, c.nbuckets = handles, nwords, gaps.shape[1]
        c.late_ns = late_ns
        self._keep = (c.words, c.gaps, c.photons)
        self.c: Any = c  # (a shm_figures_t *, for a writer)

    def count(self, handles: Any, now_ns: int, applied: Any = None) -> None:
        """One chunk emitted at ``now_ns`` to each of ``handles`` (a ``uint32``
        buffer, distinct; out of range: skipped), ``applied`` their receipts
        (``uint32``; None: no session has acted)."""
        h = ffi.from_buffer("uint32_t[]", handles)
        a = ffi.NULL if applied is None else ffi.from_buffer("uint32_t[]", applied)
        lib.shm_figures_count(self.c, h, a, len(handles), now_ns)
