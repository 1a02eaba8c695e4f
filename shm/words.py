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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shm.native import lib

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
