"""Rows pushed in place: a step's record written straight into a ring, in one C call.

A writer that sends one record of rows per step (rte's STEP record: a fixed
head, then columns of slot numbers, generations, chunk indices, generation
times, handles and receipts) would otherwise pack the record into a Python
``bytearray`` (one ``struct`` call over ``6 n`` Python ints), stamp it and
copy it into the ring. :func:`push_rows` hands the columns to the C
(``shm_ring_push_rows`` in ``csrc/shm_native.c``), which reserves the room,
writes the head and every column in place, stamps the clock at the head's
``stamp_at`` just before it publishes the record, and publishes it: no record
object, one boundary crossing per step.

The layout of the head is the caller's; this module knows columns, not what
they mean (``rte.protocol.wire`` defines the STEP record and is the reference
in Python). A full ring writes nothing and returns 0, so the caller can queue
the record as it queues any other: backpressure is the caller's policy.

Columns arrive as NumPy arrays or ``memoryview`` s of ``uint64`` (the slab's
slots and generations, read in place) and as Python lists (chunk indices,
handles, receipts), each copied once into an ``array.array`` (a buffer given
instead is read in place). Every column's length is checked
here, before the C reads ``n`` rows of each.

The reader's side is :class:`RowsReader`: one C call (``shm_ring_pop_rows``)
drains the ring as :meth:`Ring.pop_batch_nowait` does and judges every record
it took: whether it is a record of rows of that head, whole, its handles in
range and its slots published at their generations in the slab (the check a
reader makes before it views them), and whether the slots are one run. A
record that fails any check is handed on as "other", for the caller's own
decoder to refuse it the way it always has. The same call adds each ready
record's push-to-pop time to a histogram in shared memory, and
:meth:`RowsReader.give_back` releases a record's rows and credits them
(``shm_rows_give_back``), so neither costs the reader a Python operation per
step beyond its one call.
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from shm.errors import SegmentError, check_rc
from shm.native import ffi, lib
from shm.ring import Ring
from shm.segment import Segment
from shm.slab_core import SlabCore
from shm.words import Word

_WAKE = int(lib.SHM_WAKE)
_FULL = int(lib.SHM_RING_FULL)
_UNSENT = (_FULL, int(lib.SHM_RING_CORRUPT))  # published, not pushed: the caller sends it
OTHER = int(lib.SHM_ROWS_OTHER)  # a record the caller decodes itself
SCATTERED = int(lib.SHM_ROWS_SCATTERED)  # ready rows whose slots are not one run
ROW_BYTES = 8 + 8 + 8 + 8 + 4 + 4  # the six columns' bytes per row
_GONE = (int(lib.SHM_SLAB_STALE), int(lib.SHM_SLAB_FOREIGN))  # a reclaimed slot: skip
_INT64 = np.dtype(np.int64)
_OWN = "the ring's own segment"  # where a reader's words must lie


def _row_columns(
    slots: Any,
    generations: Any,
    chunks: Sequence[int] | np.ndarray[Any, Any],
    generated_ns: int | Sequence[int],
    handles: Sequence[int],
    applied: Sequence[int] | None,
) -> tuple[Any, ...]:
    """The C's arguments for ``n`` rows' columns (slots, generations, chunks,
    generated and its stride, handles, applied, ``n``), each length checked."""
    n = len(slots)
    if not (len(generations) == len(chunks) == len(handles) == n) or (
        applied is not None and len(applied) != n
    ):
        raise ValueError(
            f"a record of {n} rows needs every column of {n}: generations "
            f"{len(generations)}, chunks {len(chunks)}, handles {len(handles)}, "
            f"applied {'none' if applied is None else len(applied)}"
        )
    if isinstance(generated_ns, int):
        generated, stride = [generated_ns], 0
    else:
        if len(generated_ns) != n:
            raise ValueError(f"a record of {n} rows has {len(generated_ns)} generation times")
        generated, stride = _column("q", "int64_t[]", generated_ns), 1
    return (
        ffi.from_buffer("uint64_t[]", slots),
        ffi.from_buffer("uint64_t[]", generations),
        _column("q", "int64_t[]", chunks),
        generated,
        stride,
        _column("I", "uint32_t[]", handles),
        ffi.NULL if applied is None else _column("I", "uint32_t[]", applied),
        n,
    )


def _column(code: str, c_type: str, values: Any) -> Any:
    """A C array over ``values``: a list copied once (``array.array``, faster
    than cffi's own conversion of a list), a buffer (NumPy array,
    ``memoryview``) read in place."""
    if type(values) is list:
        values = array.array(code, values)
    return ffi.from_buffer(c_type, values)


def push_rows(
    ring: Ring,
    head: bytes,
    stamp_at: int,
    slots: Any,
    generations: Any,
    chunks: Sequence[int] | np.ndarray[Any, Any],
    generated_ns: int | Sequence[int],
    handles: Sequence[int],
    applied: Sequence[int] | None = None,
) -> int:
    """Write ``head`` and the columns of ``len(slots)`` rows into ``ring`` as one
    record, in place; returns the clock (``time.monotonic_ns``) stamped at
    ``head[stamp_at:stamp_at + 8]`` as it was pushed, or 0 when the ring has no
    room (nothing written, no full event counted: the caller queues the record).

    ``slots``, ``generations``: ``uint64`` words (read in place); ``chunks``,
    ``generated_ns`` (one time for all rows, or one per row): int64;
    ``handles`` and ``applied`` (None: all 0): uint32. Rings the ring's
    doorbell when its consumer sleeps.

    Raises:
        RecordTooLarge: the record can never fit the ring.
        RingCorrupt: the ring's head is not one a push left (its peer garbled it).
        ValueError: the columns' lengths differ.
        ShmError: ``head`` is not 8-aligned or does not hold ``stamp_at``, or
            there are no rows.
        SegmentError: the ring's segment is closed in this process.
    """
    columns = _row_columns(slots, generations, chunks, generated_ns, handles, applied)
    pushed = ffi.new("int64_t *")
    rc = lib.shm_ring_push_rows(ring.handle, head, len(head), stamp_at, *columns, 0, pushed)
    n = len(slots)
    if rc == 0:
        return int(pushed[0])
    if rc == _WAKE:
        if ring.doorbell is not None:
            ring.doorbell.ring()
        return int(pushed[0])
    if rc == _FULL:
        return 0
    check_rc(
        rc,
        f"push of a record of {n} rows ({len(head) + ROW_BYTES * n:,} bytes) to "
        f"the ring at offset {ring.offset} of {ring.segment.name} (largest record "
        f"{ring.max_record:,} bytes)",
    )
    return 0  # pragma: no cover  (check_rc raised)


class RowsWriter:
    """The producer of ``ring`` sending records of rows whose slots it holds in
    ``slab`` (written, not yet published): :meth:`send` publishes them, pushes
    the record in place (as :func:`push_rows`) and counts it, in one C call
    (``shm_rows_send``), where a writer's step out was three calls and two
    Python updates.

    Set up once (a ``shm_rows_out_t`` in C): ``stamp_at`` is the head's push
    stamp; ``histogram`` (``uint64`` words) and ``total`` (one word) are where
    each record's pushed-minus-emitted time is added, as
    ``rte.protocol.latency.Histogram.add`` adds it (log-linear buckets:
    :func:`log_bucket`), both words of ``words_segment`` (checked mapped before
    each call, as the ring's and the slab's are); the ``counts`` given to
    :meth:`send` (``int64``, one per handle) get one per row pushed.
    ``figures`` (a ``shm_figures_t *``, or None): each handle's figures, counted
    for every row pushed at its record's emission time (``shm_figures_count``).
    """

    __slots__ = ("_c", "_counts", "_keep", "_pushed", "_segments", "ring")

    def __init__(
        self,
        ring: Ring,
        slab: SlabCore,
        stamp_at: int,
        *,
        histogram: memoryview | None = None,
        total: memoryview | None = None,
        words_segment: Segment | None = None,
        figures: Any = None,
    ) -> None:
        self.ring = ring
        words = words_segment or ring.segment
        self._segments = (ring.segment, slab.segment, words)  # each checked open before a call
        c = self._c = ffi.new("shm_rows_out_t *")
        c.ring, c.slab, c.stamp_at = ring.handle, slab.meta, stamp_at
        if histogram is not None:
            c.histogram, c.nbuckets = _words_in(words, histogram), len(histogram)
        if total is not None:
            c.total = _words_in(words, total)
        self._counts: Any = None
        self._pushed = ffi.new("int64_t *")  # the C's out-parameter, reused
        if figures is not None:  # (its owner keeps the memory it points at)
            c.figures = figures
        self._keep = (histogram, total, figures)  # (their mappings outlive the pointers)

    def send(
        self,
        head: bytes,
        slots: Any,
        generations: Any,
        chunks: Sequence[int] | np.ndarray[Any, Any],
        generated_ns: int | Sequence[int],
        handles: Sequence[int],
        applied: Sequence[int] | None,
        emitted_ns: int,
        counts: np.ndarray[Any, Any] | None = None,
    ) -> int:
        """Publish ``slots``, push the record of their rows and count it; rings the
        doorbell when the reader sleeps. Returns the push stamp; 0 when the slots
        were published but the record was not pushed (the ring has no room, or
        its reader garbled it: send it another way); -1 when some slot was not
        the writer's to publish any more (reclaimed: nothing pushed or counted).
        Columns as :func:`push_rows`; ``counts``: ``int64``, one per handle.

        Raises:
            RecordTooLarge: the record can never fit the ring (its slots published).
            ValueError: the columns' lengths differ.
            SegmentError: the ring's or the slab's segment is closed here.
        """
        columns = _row_columns(slots, generations, chunks, generated_ns, handles, applied)
        for segment in self._segments:  # (the pointers would reach unmapped memory)
            if segment.closed:
                raise SegmentError(f"segment {segment.name} is closed here")
        c = self._c
        if counts is not self._counts:  # (the owner's counts grow by a new array)
            if counts is not None and counts.dtype != _INT64:
                raise ValueError(f"counts must be int64, not {counts.dtype}")
            c.counts = ffi.NULL if counts is None else ffi.from_buffer("int64_t[]", counts)
            c.ncounts = 0 if counts is None else len(counts)
            self._counts = counts
        pushed = self._pushed
        rc = lib.shm_rows_send(c, head, len(head), *columns, emitted_ns, pushed)
        if rc == _WAKE and self.ring.doorbell is not None:
            self.ring.doorbell.ring()
        elif rc < 0 and rc not in _UNSENT and pushed[0] == 0:
            check_rc(rc, f"send of a record of {len(slots)} rows to {self.ring.where()}")
        return int(pushed[0])


class RowsReader:
    """The consumer of ``ring`` reading records of rows whose slots lie in
    ``slab``: a head of ``head_len`` bytes starting with byte ``kind``, its row
    count the ``uint32`` at ``count_at``, then the columns :func:`push_rows`
    writes; handles below ``handles``.

    Set up once (a ``shm_rows_t`` in C, so each call passes a few pointers, not
    a dozen numbers), it can also time what it pops and give rows back in one
    call: ``histogram`` (words of the ring's own segment, ``uint64``): each
    record judged ready adds its push-to-pop time there, read from the int64
    push stamp at ``stamp_at`` of its head (log-linear buckets,
    :func:`log_bucket`); ``owner``, ``counts`` (words of the ring's segment,
    one per handle) and ``starved`` (a word of the ring's segment) are where
    :meth:`give_back` releases, credits and wakes the writer; ``given`` (a word
    of the ring's segment) is stamped with the clock at each give back that
    credits (when the writer's credits came: what its wait learns).
    """

    __slots__ = ("_c", "_info", "_keep", "_lens", "_max", "_out", "_segments", "_slab", "ring")

    def __init__(
        self,
        ring: Ring,
        slab: SlabCore,
        kind: int,
        head_len: int,
        count_at: int,
        handles: int,
        *,
        histogram: memoryview | None = None,
        stamp_at: int = 0,
        owner: int = 0,
        counts: memoryview | None = None,
        starved: Word | None = None,
        given: Word | None = None,
    ) -> None:
        self.ring = ring
        self._slab = slab
        self._out, self._lens = ring.consumer_buffers()
        self._segments = (ring.segment, slab.segment)  # each checked open before a call
        self._max = ring.capacity // 8
        self._info = ffi.new("int64_t[]", self._max)
        c = self._c = ffi.new("shm_rows_t *")
        c.ring, c.slab, c.out, c.out_cap = ring.handle, slab.meta, self._out, ring.capacity
        c.lens, c.info, c.max_n = self._lens, self._info, self._max
        c.type, c.head_len, c.count_at, c.nhandles = kind, head_len, count_at, handles
        c.stamp_at, c.owner = stamp_at, owner
        if histogram is not None:
            c.histogram, c.nbuckets = _words_in(ring.segment, histogram, _OWN), len(histogram)
        if counts is not None:
            c.counts, c.ncounts = _words_in(ring.segment, counts, _OWN), len(counts)
        for name, word in (("starved", starved), ("given", given)):
            if word is not None:
                if word.segment is not ring.segment:
                    raise ValueError(f"the {name} word must lie in the ring's own segment")
                setattr(c, name, ring.segment.word(word.offset))
        self._keep = (histogram, counts, starved, given)  # (their mappings outlive the pointers)

    def _closed(self) -> bool:
        """Whether the ring's or the slab's segment is closed here (its pointers
        reach unmapped memory then)."""
        ring, slab = self._segments
        return ring.closed or slab.closed

    def pop(self) -> list[tuple[bytes, int]]:
        """Every record available now, each with its verdict: its first slot
        (``>= 0``: ready rows in one run), :data:`SCATTERED` (ready rows, not one
        run) or :data:`OTHER` (any other record, or rows that fail a check);
        [] when the ring is empty.

        Raises:
            RingCorrupt: the ring's bytes are not records (nothing taken).
            SegmentError: the ring's or the slab's segment is closed here.
        """
        out, lens, info = self._out, self._lens, self._info
        ring, slab = self._segments
        if ring.closed or slab.closed:  # (the pointers would reach unmapped memory)
            self.ring.handle, self._slab.meta  # noqa: B018  (SegmentError, saying which)
        n = int(lib.shm_rows_pop(self._c))
        if n <= 0:
            if n < 0:
                check_rc(n, f"batch pop from {self.ring.where()}")
            return []
        if n == 1:
            return [(ffi.unpack(out, lens[0]), info[0])]
        records, at = [], 0
        unpack = ffi.unpack
        for i in range(n):
            size = lens[i]
            records.append((unpack(out + at, size), info[i]))
            at += size
        return records

    def give_back(self, record: bytes, rows: Any = None, credit: bool = True) -> bool | None:
        """Give back rows of ``record`` (one this reader judged ready), in one C
        call: every row's slot (``rows`` None), or those of ``rows`` (int64
        positions; out of range skipped), released for the owner; when all were
        and ``credit``, one to ``counts[handle]`` of each and the starved word
        cleared. Returns whether it was set (ring the writer: it waits for these
        credits); None when some slot was not the owner's to give back any more
        (reclaimed: nothing credited, the others released) or a segment is
        closed here (nothing done: nobody reads these any more)."""
        if self._closed():
            return None
        if rows is None:
            picked, npick = ffi.NULL, 0
        else:
            if rows.dtype != _INT64 or not rows.flags.c_contiguous:
                rows = np.ascontiguousarray(rows, np.int64)
            picked, npick = ffi.from_buffer("int64_t[]", rows), len(rows)
        rc = int(lib.shm_rows_give_back(self._c, record, len(record), picked, npick, credit))
        if rc >= 0:
            return bool(rc & 1)
        if rc in _GONE:
            return None
        check_rc(rc, f"give back of a record of rows of {len(record)} bytes")
        return None  # pragma: no cover  (check_rc raised)


def log_bucket(ns: int, buckets: int) -> int:
    """The C's log-linear bucket of a duration (what :class:`RowsReader` adds to
    its histogram): four per power of two from 128 ns, at most ``buckets - 1``."""
    return int(lib.shm_log_bucket(ns, buckets))


def _words_in(segment: Segment, words: memoryview, whose: str = "") -> Any:
    """A ``uint64_t *`` over ``words``, which must lie in ``segment`` (checked
    mapped before every call that uses it; ``whose`` names it in the error),
    holding no export (an export would keep the segment from closing)."""
    with ffi.from_buffer(words) as buffer:
        offset = int(ffi.cast("uintptr_t", buffer)) - segment.address
    if offset < 0 or offset % 8 or words.itemsize != 8:
        where = whose or f"segment {segment.name}"
        raise ValueError(f"the words must be uint64 words of {where}")
    segment.ptr(offset + words.nbytes - 1)  # (SegmentError past the mapping)
    return segment.word(offset)
