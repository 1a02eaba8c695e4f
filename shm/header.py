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
The start time is the kernel's own count since boot (:func:`process_start_time`),
never one read against the wall clock: psutil's ``create_time`` adds the boot
time as ``/proc/stat`` gives it at the call, and a clock slew moves that by a
second now and then, after which every live peer would look dead (a client
raised EngineGone on a running daemon in a CI run; a daemon would have reaped
its live clients).
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass

import psutil

from shm.errors import ForeignSegmentError, SegmentVersionError

PAGE = mmap.PAGESIZE
HEADER_SIZE = max(PAGE, 4096)
# 2: a daemon's clients each have segments of their own; 3: start times since boot
LAYOUT_VERSION = 3
MAGIC = int.from_bytes(b"rteseg01", "little")
# magic u64 | version u32 | kind u32 | size u64 | pid u64 | start time f64 | created f64
_LAYOUT = struct.Struct("<QIIQQdd")


def page_align(n: int) -> int:
    """``n`` rounded up to a whole number of pages."""
    return (n + PAGE - 1) // PAGE * PAGE


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC_STAT = os.path.exists("/proc/self/stat")  # Linux: read the kernel's count


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started, None if it is gone (or a zombie). On Linux
    in seconds since boot: ``starttime`` of ``/proc/PID/stat``, a count of clock
    ticks that nothing changes once the process runs. Elsewhere psutil's
    ``create_time`` (seconds since the epoch, as that system keeps it)."""
    if not _PROC_STAT:
        return _psutil_start_time(pid)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # gone (or never was)
        return None
    # pid (comm) state ... : comm may hold anything, so the fields after its last ")"
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):  # a zombie or dead: not running
        return None
    return int(fields[19]) / _CLOCK_TICKS  # field 22, starttime


def _psutil_start_time(pid: int) -> float | None:
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
    pid = os.getpid()
    start = process_start_time(pid)
    _LAYOUT.pack_into(mapping, 0, 0, LAYOUT_VERSION, kind, size, pid, start, time.time())


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
