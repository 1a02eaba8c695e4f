"""The file behind a segment: created and backed whole, or opened and mapped as asked.

:func:`create` makes the POSIX shared-memory object (mode 0600, never over an
existing one) and maps it; :func:`map_existing` maps one that exists with the
access its opener gets: all writable, all read-only (an inspector), or a
writable prefix with the whole read-only beside it (a slab's reader, who must
write the slot words and never the slots). :class:`~shm.segment.Segment` reads
and checks the header on top. Uses posix_ipc, never
``multiprocessing.shared_memory``, whose resource tracker unlinks segments that
other processes still use.

A segment is fully backed when it is created (``posix_fallocate``), so a
``/dev/shm`` too small for it is a :class:`~shm.errors.SegmentSpaceError` at
start-up that says how to make room, never a SIGBUS in the middle of a stream
when a page is first touched. The free space is looked at first, for a message
that gives both numbers.
"""

from __future__ import annotations

import errno
import mmap
import os

import posix_ipc

from shm.errors import (
    ForeignSegmentError,
    SegmentError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSpaceError,
)
from shm.header import HEADER_SIZE, page_align
from shm.names import SHM_DIR, unlink_segment


def create(name: str, size: int) -> mmap.mmap:
    """Create the object ``name`` of ``size`` bytes (page-aligned), backed now, mapped.

    Raises:
        SegmentExistsError: ``name`` exists.
        SegmentSpaceError: :data:`~shm.names.SHM_DIR` cannot back it (nothing is left).
    """
    try:
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
    except posix_ipc.ExistentialError:
        raise SegmentExistsError(f"shared-memory segment {name} already exists") from None
    try:
        reserve(shm.fd, size, name)
        return mmap.mmap(shm.fd, size)
    except BaseException:
        unlink_segment(name)
        raise
    finally:
        shm.close_fd()


def map_existing(name: str, readonly: bool, writable_below: int | None) -> list[mmap.mmap]:
    """Map the existing object ``name``: [the whole] or, with ``writable_below``
    (and not ``readonly``), [the whole read-only, the bytes below it writable].

    Raises:
        SegmentNotFoundError: no object of that name.
        SegmentError: it belongs to another user (permission denied).
        ForeignSegmentError: smaller than a header.
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
        return mappings
    except BaseException:
        for mapping in mappings:
            mapping.close()
        raise
    finally:
        shm.close_fd()
        if prefix is not None:
            prefix.close_fd()


def reserve(fd: int, size: int, name: str) -> None:
    """Back ``size`` bytes of the segment ``name`` open at ``fd``.

    Raises:
        SegmentSpaceError: :data:`~shm.names.SHM_DIR` has not that much room.
    """
    free = free_bytes()
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


def free_bytes() -> int | None:
    """The bytes free in :data:`~shm.names.SHM_DIR` for this user, None if unknown."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
