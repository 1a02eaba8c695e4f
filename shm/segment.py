"""Segment: a named POSIX shared-memory region with a versioned header.

Created mode 0600 and fully backed at creation (``posix_fallocate``), so a
``/dev/shm`` too small for it is a clear error at start-up, never a SIGBUS in
the middle of a stream. The first page is the header: magic, layout version, a
kind tag, the total size, and the creator's pid and start time (pid alone is
reused by the OS; pid plus start time names one process). The magic is
published last with a release store, so an opener never sees a half-written
header. Everything after the first page is the user's.

The creator owns unlinking. ``close`` releases the pointers this object handed
out; NumPy views a caller still holds keep the mapping alive until they go.

Named per user (``/rte.<uid>.<name>``, made by :func:`shm.names.shm_name`):
another user's daemon of the same name is another segment. Uses posix_ipc,
never ``multiprocessing.shared_memory``, whose resource tracker unlinks
segments that other processes still use.
"""

from __future__ import annotations

import contextlib
import errno
import math
import mmap
import os
import struct
import time
from typing import Any

import numpy as np
import posix_ipc
import psutil

from shm.errors import (
    ForeignSegmentError,
    SegmentError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSpaceError,
    SegmentVersionError,
)
from shm.names import SHM_DIR, unlink_segment
from shm.native import ffi, lib

PAGE = mmap.PAGESIZE
HEADER_SIZE = max(PAGE, 4096)
LAYOUT_VERSION = 1
MAGIC = int.from_bytes(b"rteseg01", "little")
# magic u64 | version u32 | kind u32 | size u64 | pid u64 | start time f64 | created f64
_HEADER = struct.Struct("<QIIQQdd")


def page_align(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


def process_start_time(pid: int) -> float | None:
    """The start time of process ``pid`` (seconds since the epoch), None if gone."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(proc.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def is_alive(pid: int, start_time: float) -> bool:
    """Whether the process that had ``pid`` and ``start_time`` still runs."""
    now = process_start_time(pid)
    return now is not None and abs(now - start_time) < 0.05


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
        self._base: Any = ffi.from_buffer("char[]", mapping, require_writable=not readonly)
        _, _, kind, size, pid, start, created = _HEADER.unpack_from(mapping, 0)
        self.kind = kind
        self.size = size
        self.creator_pid = pid
        self.creator_start = start
        self.created = created

    # -- lifecycle --------------------------------------------------------

    @classmethod
    def create(cls, name: str, size: int, *, kind: int = 0) -> Segment:
        """Create segment ``name`` of ``size`` bytes in all (header included), backed now."""
        size = page_align(max(size, HEADER_SIZE))
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
        except posix_ipc.ExistentialError:
            raise SegmentExistsError(f"shared-memory segment {name} already exists") from None
        try:
            _reserve(shm.fd, size, name)
            mapping = mmap.mmap(shm.fd, size)
        except BaseException:
            unlink_segment(name)
            raise
        finally:
            shm.close_fd()
        me = psutil.Process()
        _HEADER.pack_into(
            mapping, 0, 0, LAYOUT_VERSION, kind, size, me.pid, me.create_time(), time.time()
        )
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
        split = writable_below is not None
        try:
            shm = posix_ipc.SharedMemory(name, read_only=readonly or split)
            prefix = posix_ipc.SharedMemory(name) if split and not readonly else None
        except posix_ipc.ExistentialError:
            raise SegmentNotFoundError(f"no shared-memory segment {name}") from None
        except posix_ipc.PermissionsError:
            raise SegmentError(
                f"{name} belongs to another user (permission denied); daemons are per user"
            ) from None
        mappings: list[mmap.mmap] = []
        try:
            actual = os.fstat(shm.fd).st_size
            if actual < HEADER_SIZE:
                raise ForeignSegmentError(
                    f"{name} is not an rte segment ({actual} bytes, smaller than a header)"
                )
            access = mmap.ACCESS_READ if readonly or split else mmap.ACCESS_WRITE
            mappings.append(mmap.mmap(shm.fd, actual, access=access))
            if prefix is not None:
                assert writable_below is not None
                size = min(page_align(max(writable_below, HEADER_SIZE)), actual)
                mappings.append(mmap.mmap(prefix.fd, size, access=mmap.ACCESS_WRITE))
            return cls._checked(name, mappings, actual, kind, readonly)
        except BaseException:
            for mapping in mappings:
                mapping.close()
            raise
        finally:
            shm.close_fd()
            if prefix is not None:
                prefix.close_fd()

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
        _, version, seg_kind, size, *_ = _HEADER.unpack_from(mapping, 0)
        if magic != MAGIC:
            raise ForeignSegmentError(
                f"{name} is not an rte segment, or its creator has not finished writing it"
            )
        if version != LAYOUT_VERSION:
            raise SegmentVersionError(
                f"{name} has layout version {version}; this rte reads version {LAYOUT_VERSION}. "
                "Stop the daemon that made it, or use the rte version it runs."
            )
        if size != actual:
            raise ForeignSegmentError(f"{name} header says {size} bytes but the file has {actual}")
        if kind is not None and seg_kind != kind:
            raise ForeignSegmentError(f"{name} is a segment of kind {seg_kind}, expected {kind}")
        if len(mappings) == 2:  # the writable prefix for ptr/word, the whole read-only
            return cls(name, mappings[1], owner=False, whole=mapping)
        return cls(name, mapping, owner=False, readonly=readonly)

    def creator_alive(self) -> bool:
        return is_alive(self.creator_pid, self.creator_start)

    def close(self) -> None:
        """Unmap. Views still held by callers keep the mapping alive until they go."""
        if self._mmap is None:
            return
        ffi.release(self._base)
        mappings = [self._mmap, self._whole]
        self._mmap = self._whole = None
        for mapping in mappings:
            if mapping is not None:
                with contextlib.suppress(BufferError):  # a view is held: it goes with the last
                    mapping.close()

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
        if offset >= len(self._live()):
            raise SegmentError(f"offset {offset} of {self.name} is not mapped writable here")
        return self._base + offset

    def word(self, offset: int) -> Any:
        """A ``uint64_t *`` at ``offset`` (8-aligned), for the atomics."""
        return ffi.cast("uint64_t *", self.ptr(offset))

    def array(
        self, offset: int, dtype: Any, shape: tuple[int, ...], *, readonly: bool
    ) -> np.ndarray[Any, Any]:
        """A NumPy view of the segment's bytes at ``offset``: no copy."""
        return self.view(offset, np.dtype(dtype), math.prod(shape), shape, readonly=readonly)

    def view(
        self,
        offset: int,
        dtype: np.dtype[Any],
        count: int,
        shape: tuple[int, ...],
        *,
        readonly: bool,
    ) -> np.ndarray[Any, Any]:
        """:meth:`array` for callers that already hold the dtype and element count."""
        if offset < HEADER_SIZE or offset + count * dtype.itemsize > self.size:
            raise ValueError(
                f"view of {count} x {dtype} at {offset} is outside segment {self.name}"
            )
        mapping = self.mapping(readonly=readonly)
        end = offset + count * dtype.itemsize
        if end > len(mapping):
            raise SegmentError(f"{self.name} is mapped read-only from {len(mapping)} on here")
        view = np.frombuffer(mapping, dtype=dtype, count=count, offset=offset).reshape(shape)
        if readonly:
            view.flags.writeable = False
        return view

    def mapping(self, *, readonly: bool) -> mmap.mmap:
        """What views are made from: for a reader mapped writable only below some
        offset, the whole segment mapped read-only; otherwise the live mapping."""
        return self._live() if self._whole is None or not readonly else self._whole

    def bytes_at(self, offset: int, size: int) -> memoryview:
        return memoryview(self._live())[offset : offset + size]

    @property
    def address(self) -> int:
        """The mapping's address in this process (to prove a view shares it)."""
        return int(ffi.cast("uintptr_t", self.ptr(0)))


def _reserve(fd: int, size: int, name: str) -> None:
    free = _free_bytes()
    if free is not None and free < size:
        raise SegmentSpaceError(
            f"{name} needs {size:,} bytes but {SHM_DIR} has {free:,} free; make /dev/shm "
            "larger (Docker: --shm-size) or ask for fewer slots or smaller rings"
        )
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise SegmentSpaceError(
                f"{name} needs {size:,} bytes and {SHM_DIR} could not back them ({exc.strerror}); "
                "make /dev/shm larger (Docker: --shm-size)"
            ) from None
        raise


def _free_bytes() -> int | None:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
