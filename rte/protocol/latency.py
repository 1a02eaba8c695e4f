"""Delivery latency histograms kept in shared memory, for ``rte inspect``.

Each chunk's :class:`~rte.contract.Timing` says when the step emitted it, when
its STEP record was pushed and when the client took it. The daemon adds
emitted-to-pushed (its own side) to a histogram in its control block; each
client adds pushed-to-taken (the wake-up and its own side) to one in its
client block. An inspector reads both without asking anyone and reports
percentiles (``rte inspect``; ``--watch`` shows the change since the last
refresh, i.e. recent deliveries).

Buckets are log-linear: four per power of two from 128 ns (so a reported
percentile is the upper edge of a bucket at most 19% wide), bucket 0 holds
everything below, the last everything from about 2 s. One word per bucket,
single writer, one add per step batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BUCKETS = 100
SUB = 4  # buckets per power of two
LOW_BITS = 7  # below 2**7 ns: bucket 0


def bucket(ns: int) -> int:
    """The bucket of a duration in ns (negative counts as 0)."""
    bits = ns.bit_length() if ns > 0 else 0
    if bits <= LOW_BITS:
        return 0
    index = SUB * (bits - LOW_BITS) + ((ns >> (bits - 3)) & (SUB - 1))
    return index if index < BUCKETS else BUCKETS - 1


def upper_ns(index: int) -> int:
    """The first duration past bucket ``index`` (its upper edge)."""
    if index <= 0:
        return 1 << LOW_BITS
    bits, sub = divmod(index, SUB)
    bits += LOW_BITS
    return (SUB + sub + 1) << (bits - 3)


class Histogram:
    """A histogram over ``BUCKETS`` words: a ``memoryview`` of shared memory cast to
    unsigned 64-bit words (one add is two C-level item operations, no NumPy call)."""

    def __init__(self, words: memoryview, total: memoryview | None = None) -> None:
        if len(words) != BUCKETS:
            raise ValueError(f"a histogram has {BUCKETS} buckets, got {len(words)}")
        self.words = words
        self.total = total  # one word: the sum of the durations added, in ns (or None)

    def add(self, ns: int, n: int = 1) -> None:
        self.words[bucket(ns)] += n
        total = self.total
        if total is not None and ns > 0:
            total[0] += ns * n

    def counts(self) -> np.ndarray[Any, Any]:
        return np.array(self.words, dtype=np.int64)


def percentiles_us(counts: np.ndarray[Any, Any], qs: tuple[float, ...] = (50, 99)) -> list[float]:
    """Upper bucket edges, in µs, at the percentiles ``qs`` of ``counts`` ([] when empty)."""
    total = int(counts.sum())
    if total <= 0:
        return []
    cumulative = np.cumsum(counts)
    out = []
    for q in qs:
        index = int(np.searchsorted(cumulative, total * q / 100.0))
        out.append(upper_ns(min(index, BUCKETS - 1)) / 1e3)
    return out
