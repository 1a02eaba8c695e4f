"""One shared 64-bit word and its atomics, for the layouts built above ``shm``.

A control block, a claims table or a mailbox's credit block is a row of 8-byte
words in a :class:`~shm.Segment` that two processes read and write at once. A
:class:`Word` is one of them, made once (the pointer is cached, like a ring's
geometry) and used with the C atomics (``shm_native.h``): a load pairs with the
other side's store (acquire/release), ``cas`` and ``add`` are full barriers. So
nothing above ``shm`` imports ``shm.native``: the layouts say which word means
what, this says how a word is read and written.

    word = segment.atomic(offset)     # 8-aligned, inside the mapping
    word.store(1); word.load()        # release / acquire
    word.cas(1, 0); word.add(3)       # full barriers

:class:`Counts` is a row of such words that one side adds ones to, a batch's
worth in one C call (a client's consumed counts: its credits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from shm.native import ffi, lib

if TYPE_CHECKING:
    from shm.segment import Segment


class Word:
    """An atomic ``uint64`` at ``offset`` of ``segment``; it holds the segment."""

    __slots__ = ("_p", "offset", "segment")

    def __init__(self, segment: Segment, offset: int) -> None:
        if offset % 8:
            raise ValueError(f"a shared word is 8-aligned, not at offset {offset}")
        self.segment = segment
        self.offset = offset
        self._p: Any = segment.word(offset)

    def load(self) -> int:
        """Acquire: what the other side stored before its release is visible after."""
        return int(lib.shm_load_acquire(self._p))

    def load_relaxed(self) -> int:
        """No ordering: a figure read for show."""
        return int(lib.shm_load_relaxed(self._p))

    def store(self, value: int) -> None:
        """Release: everything written before it is visible to an acquire load."""
        lib.shm_store_release(self._p, value)

    def cas(self, expected: int, desired: int) -> bool:
        """``desired`` when the word is ``expected`` (True), else nothing (False)."""
        return bool(lib.shm_cas(self._p, expected, desired))

    def add(self, n: int) -> int:
        """Add ``n``; the value before."""
        return int(lib.shm_fetch_add(self._p, n))

    def spin_until(self, value: int, spin_ns: int) -> bool:
        """Spin up to ``spin_ns`` for the word to equal ``value`` (acquire); True when it did."""
        return bool(lib.shm_spin_until_equal(self._p, value, spin_ns))

    def __repr__(self) -> str:
        return f"Word({self.segment.name}+{self.offset})"


class Counts:
    """A row of shared ``uint64`` counters (``words``, a writable ``'Q'``
    memoryview of a segment, which it holds) that this side adds ones to.

    It holds no C pointer between calls: each call takes the view's buffer for
    its own length and gives it back. A pointer kept (a ``from_buffer`` held
    for life) was an export of the view that the cycle collector could not
    clear: a transport's objects collected in a cycle freed the view under it
    and the process died of SIGSEGV (tests/test_credit_counts.py)."""

    __slots__ = ("_n", "words")

    def __init__(self, words: memoryview) -> None:
        if words.format != "Q" or words.readonly:
            raise ValueError("Counts needs a writable memoryview of uint64 words ('Q')")
        self.words = words
        self._n = len(words)

    def add_ones(self, index: Any, rows: np.ndarray[Any, Any] | None = None) -> int:
        """One to ``counts[index[k]]`` for every k, or for every k in ``rows``
        (int64 positions into ``index``), in one C call, each add a release;
        ``index`` is a buffer of ``uint32`` (an ``array('I')``). Positions and
        indices out of range are skipped. Returns how many were added; 0 once
        the view is released (its segment gone: nobody reads these counts)."""
        try:
            counts = ffi.from_buffer("uint64_t[]", self.words)
        except ValueError:  # a released view
            return 0
        try:
            n_index = len(index)
            pointer = ffi.from_buffer("uint32_t[]", index)
            if rows is None:
                return int(lib.shm_add_ones(counts, self._n, pointer, n_index, ffi.NULL, n_index))
            if rows.dtype != np.int64 or not rows.flags.c_contiguous:
                rows = np.ascontiguousarray(rows, np.int64)
            picked = ffi.from_buffer("int64_t[]", rows)
            return int(lib.shm_add_ones(counts, self._n, pointer, n_index, picked, len(rows)))
        finally:
            ffi.release(counts)
