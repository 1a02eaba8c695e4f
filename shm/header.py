"""A segment's first page: what it is, who made it, and whether an opener may trust it.

Every segment begins with one page of header: magic, layout version, a kind
tag, the total size, and the creator's pid, start time and creation time. The
creator writes everything but the magic (:func:`write`), then publishes the
magic with a release store; an opener loads it with an acquire and only then
reads the rest (:func:`check`), so it never sees a half-written header. A
version it does not read, a size that is not the file's, or another kind is
refused with what to do.

pid alone is reused by the OS; pid plus start time names one process
(:func:`is_alive`), which is how a reader tells a dead creator from a live one.
"""

from __future__ import annotations

import mmap
import struct
import time
from dataclasses import dataclass

import psutil

from shm.errors import ForeignSegmentError, SegmentVersionError

PAGE = mmap.PAGESIZE
HEADER_SIZE = max(PAGE, 4096)
LAYOUT_VERSION = 2  # 2: a daemon's clients each have segments of their own
MAGIC = int.from_bytes(b"rteseg01", "little")
# magic u64 | version u32 | kind u32 | size u64 | pid u64 | start time f64 | created f64
_LAYOUT = struct.Struct("<QIIQQdd")


def page_align(n: int) -> int:
    """``n`` rounded up to a whole number of pages."""
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


@dataclass(frozen=True)
class Header:
    """A segment's header as read (the magic aside: it is loaded with an acquire)."""

    version: int
    kind: int
    size: int
    creator_pid: int
    creator_start: float
    created: float

    @classmethod
    def read(cls, mapping: mmap.mmap) -> Header:
        _, version, kind, size, pid, start, created = _LAYOUT.unpack_from(mapping, 0)
        return cls(version, kind, size, pid, start, created)


def write(mapping: mmap.mmap, kind: int, size: int) -> None:
    """Write a new segment's header as this process's, all but the magic (left 0:
    the creator publishes it last, with a release store)."""
    me = psutil.Process()
    _LAYOUT.pack_into(
        mapping, 0, 0, LAYOUT_VERSION, kind, size, me.pid, me.create_time(), time.time()
    )


def check(name: str, magic: int, header: Header, actual: int, kind: int | None) -> None:
    """Refuse a segment that is not ours, not whole, or not of this layout.

    Args:
        magic: the magic as loaded with an acquire (pairs with the creator's release).
        actual: the file's size in bytes.
        kind: the kind the opener expects (None: any).

    Raises:
        ForeignSegmentError: no magic (not ours, or not finished), a size that is
            not the file's, or another kind.
        SegmentVersionError: another layout version.
    """
    if magic != MAGIC:
        raise ForeignSegmentError(
            f"{name} is not an rte segment, or its creator has not finished writing it"
        )
    if header.version != LAYOUT_VERSION:
        raise SegmentVersionError(
            f"{name} has layout version {header.version}; this rte reads version "
            f"{LAYOUT_VERSION}. Stop the daemon that made it, or use the rte version it runs."
        )
    if header.size != actual:
        raise ForeignSegmentError(
            f"{name} header says {header.size} bytes but the file has {actual}"
        )
    if kind is not None and header.kind != kind:
        raise ForeignSegmentError(f"{name} is a segment of kind {header.kind}, expected {kind}")
