"""Segment: a named POSIX shared-memory region with a versioned header.

Created mode 0600 and fully backed at creation (:mod:`shm.backing`), so a
``/dev/shm`` too small for it is a clear error at start-up, never a SIGBUS in
the middle of a stream. The first page is the header (:mod:`shm.header`):
magic, layout version, a kind tag, the total size, and the creator's pid and
start time. The magic is published last with a release store, so an opener
never sees a half-written header. Everything after the first page is the user's.

The creator owns unlinking. Every NumPy view of a segment holds a buffer
export of its mapping (:mod:`shm.views`), so ``close`` never unmaps under a
view a caller still holds: that mapping goes with the last of them. ``close``
stops this object handing out pointers and views, and empties the caches of
views it made (:meth:`Segment.view_cache`); the pointers it handed out are
invalid after it (their users check :attr:`Segment.closed`). Every dtype,
shape, count and offset of a view is checked first
(:func:`~shm.views.checked_layout`): a :class:`~shm.errors.LayoutError`,
nothing mapped.

Named per user (``/rte.<uid>.<name>``, made by :func:`shm.names.shm_name`):
another user's daemon of the same name is another segment. The file behind
it (created, backed, mapped with each opener's access) is :mod:`shm.backing`.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from shm import backing, header, views
from shm.errors import LayoutError, SegmentError
from shm.header import (
    HEADER_SIZE,
    LAYOUT_VERSION,
    MAGIC,
    PAGE,
    Header,
    is_alive,
    page_align,
    process_start_time,
)
from shm.names import unlink_segment
from shm.native import ffi, lib
from shm.words import Word

__all__ = [
    "HEADER_SIZE",
    "LAYOUT_VERSION",
    "MAGIC",
    "PAGE",
    "Segment",
    "is_alive",
    "page_align",
    "process_start_time",
]


class Segment:
    """One mapped segment. Build with :meth:`create` or :meth:`open`."""

    def __init__(
        self,
        name: str,
        mapping: mmap.mmap,
        *,
        owner: bool,
        readonly: bool = False,
        whole: mmap.mmap | None = None,
    ) -> None:
        self.name = name
        self.owner = owner
        self.readonly = readonly
        self._mmap: mmap.mmap | None = mapping  # what ptr/word/bytes_at reach
        self._whole = whole  # the whole segment, read-only, when ``mapping`` is a prefix
        self.closed = False  # a plain attribute: the hot paths read it
        self._caches: list[dict[Any, Any]] = []  # view_cache()s, emptied by close
        self._base: Any = ffi.from_buffer("char[]", mapping, require_writable=not readonly)
        read = Header.read(mapping)
        self.kind = read.kind
        self.size = read.size
        self.creator_pid = read.creator_pid
        self.creator_start = read.creator_start
        self.created = read.created

    # -- lifecycle --------------------------------------------------------

    @classmethod
    def create(cls, name: str, size: int, *, kind: int = 0) -> Segment:
        """Create segment ``name`` of ``size`` bytes in all (header included), backed now."""
        size = page_align(max(size, HEADER_SIZE))
        mapping = backing.create(name, size)
        header.write(mapping, kind, size)
        segment = cls(name, mapping, owner=True)
        # release: the header is whole before an opener can see the magic;
        # pairs with the acquire in open
        lib.shm_store_release(segment.word(0), MAGIC)
        return segment

    @classmethod
    def open(
        cls,
        name: str,
        *,
        kind: int | None = None,
        readonly: bool = False,
        writable_below: int | None = None,
    ) -> Segment:
        """Map the existing segment ``name``; refuse foreign or other-version ones.

        ``readonly`` maps it without write permission (an inspector's view): any
        write through it is refused by the kernel, so looking cannot disturb.
        ``writable_below`` maps only the bytes below that offset (page-rounded)
        writable and the rest read-only: a reader's view of a slab, whose state
        words it must write but whose data it must never be able to.

        Raises:
            SegmentNotFoundError: no segment of that name.
            SegmentError: it belongs to another user (permission denied).
            ForeignSegmentError, SegmentVersionError: not one of ours, or another layout.
        """
        mappings = backing.map_existing(name, readonly, writable_below)
        try:
            return cls._checked(name, mappings, len(mappings[0]), kind, readonly)
        except BaseException:
            for mapping in mappings:
                mapping.close()
            raise

    @classmethod
    def _checked(
        cls, name: str, mappings: list[mmap.mmap], actual: int, kind: int | None, readonly: bool
    ) -> Segment:
        mapping = mappings[0]
        base = ffi.from_buffer("char[]", mapping)
        try:
            magic = lib.shm_load_acquire(ffi.cast("uint64_t *", base))  # pairs with create
        finally:
            ffi.release(base)
        header.check(name, magic, Header.read(mapping), actual, kind)
        if len(mappings) == 2:  # the writable prefix for ptr/word, the whole read-only
            return cls(name, mappings[1], owner=False, whole=mapping)
        return cls(name, mapping, owner=False, readonly=readonly)

    def creator_alive(self) -> bool:
        return is_alive(self.creator_pid, self.creator_start)

    def close(self) -> None:
        """Stop handing out pointers and views, and unmap what no view holds.

        A mapping that a caller's view still holds is never unmapped under it:
        it goes with the last such view. Pointers from :meth:`ptr` and
        :meth:`word` are invalid after: their users check :attr:`closed`.
        """
        if self._mmap is None:
            return
        self.closed = True
        for cache in self._caches:
            cache.clear()
        ffi.release(self._base)
        mappings = [self._mmap, self._whole]
        self._mmap = self._whole = None
        for mapping in mappings:
            if mapping is not None:
                views.unmap(mapping)

    def unlink(self) -> None:
        """Remove the name (creator's duty); mappings stay valid until closed."""
        unlink_segment(self.name)

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- access -----------------------------------------------------------

    def _live(self) -> mmap.mmap:
        if self._mmap is None:
            raise SegmentError(f"segment {self.name} is closed")
        return self._mmap

    def ptr(self, offset: int) -> Any:
        """A ``char *`` at ``offset`` (for the C functions)."""
        if not 0 <= offset < len(self._live()):
            raise SegmentError(f"offset {offset} of {self.name} is not mapped writable here")
        return self._base + offset

    def word(self, offset: int) -> Any:
        """A ``uint64_t *`` at ``offset`` (8-aligned), for the atomics."""
        return ffi.cast("uint64_t *", self.ptr(offset))

    def atomic(self, offset: int) -> Word:
        """The shared word at ``offset`` (8-aligned), with its atomics."""
        return Word(self, offset)

    def array(
        self, offset: int, dtype: Any, shape: tuple[int, ...], *, readonly: bool
    ) -> np.ndarray[Any, Any]:
        """A NumPy view of the segment's bytes at ``offset``: no copy.

        Raises:
            LayoutError: a bad dtype or shape (:func:`~shm.views.checked_layout`), or
                an offset outside the segment's user part.
        """
        room = self.size - offset if HEADER_SIZE <= offset <= self.size else -1
        if room < 0:
            raise LayoutError(f"offset {offset} is outside segment {self.name}")
        where = f"the bytes from offset {offset} of {self.name}"
        shape = tuple(shape) if isinstance(shape, list) else shape
        dt, count = views.checked_layout(dtype, shape, room, where)
        return self.view(offset, dt, count, shape, readonly=readonly)

    def view(
        self,
        offset: int,
        dtype: np.dtype[Any],
        count: int,
        shape: tuple[int, ...],
        *,
        readonly: bool,
    ) -> np.ndarray[Any, Any]:
        """:meth:`array` for callers that hold a dtype and element count from
        :func:`~shm.views.checked_layout` already (this checks only the bounds).

        Raises:
            LayoutError: ``count`` is under 1, ``dtype`` holds objects, or the
                bytes are outside the segment's user part; ``shape`` does not
                hold ``count`` elements.
            SegmentError: closed, or those bytes are mapped read-only here.
        """
        end = offset + count * dtype.itemsize
        if count < 1 or offset < HEADER_SIZE or end > self.size or dtype.hasobject:
            raise LayoutError(
                f"a view of {count} x {dtype} at {offset} is not one of segment {self.name}'s "
                f"(its user part is {HEADER_SIZE}-{self.size}, and a view holds at least one "
                "element of a dtype without objects)"
            )
        return views.flat(self._mapping(readonly, end), offset, dtype, count, shape, readonly)

    def rows(
        self,
        offset: int,
        count: int,
        stride: int,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        *,
        readonly: bool,
    ) -> np.ndarray[Any, Any]:
        """``count`` rows of ``dtype`` x ``shape``, ``stride`` bytes apart from
        ``offset``, as one ``(count, *shape)`` array (a slab's slots as one view).

        ``dtype`` and ``shape`` come from :func:`~shm.views.checked_layout` for
        ``stride`` bytes; the view holds the mapping as :meth:`view` does.

        Raises:
            LayoutError: the rows do not lie in the segment's user part.
            SegmentError: closed, or those bytes are mapped read-only here.
        """
        end = offset + count * stride
        row = dtype.itemsize * views.elements(shape)
        if count < 1 or row > stride or offset < HEADER_SIZE or end > self.size:
            raise LayoutError(
                f"{count} rows of {row} bytes {stride} apart at {offset} are not in "
                f"segment {self.name} (its user part is {HEADER_SIZE}-{self.size})"
            )
        mapping = self._mapping(readonly, end)
        return views.strided(mapping, offset, count, stride, dtype, shape, readonly)

    def view_cache(self) -> dict[Any, Any]:
        """A dict for views made once and reused (a slab's typed views), which
        :meth:`close` empties: the segment's own hold on its mapping ends there."""
        cache: dict[Any, Any] = {}
        self._caches.append(cache)
        return cache

    def _mapping(self, readonly: bool, end: int) -> mmap.mmap:
        """What views ending at ``end`` are made from: for a reader mapped writable
        only below some offset, the whole segment mapped read-only; otherwise the
        live mapping."""
        mapping = self._live() if self._whole is None or not readonly else self._whole
        if end > len(mapping):
            raise SegmentError(f"{self.name} is mapped read-only from {len(mapping)} on here")
        return mapping

    def bytes_at(self, offset: int, size: int) -> memoryview:
        """``size`` bytes at ``offset`` of the writable mapping (the view holds it)."""
        mapping = self._live()
        if size < 0 or not 0 <= offset <= len(mapping) - size:
            raise LayoutError(f"{size} bytes at {offset} are not mapped writable in {self.name}")
        return memoryview(mapping)[offset : offset + size]

    @property
    def address(self) -> int:
        """The mapping's address in this process (to prove a view shares it)."""
        return int(ffi.cast("uintptr_t", self.ptr(0)))
