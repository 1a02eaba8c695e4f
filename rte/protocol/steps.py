"""The STEP record's hot path: written into the client's ring in place, in C.

The daemon sends each client one STEP record per step
(:mod:`rte.protocol.wire` defines it and stays the reference in Python:
:func:`~rte.protocol.wire.encode_step` packs a ``bytearray``,
:func:`~rte.protocol.wire.stamp_pushed` stamps it, the ring copies it in).
:func:`push_step` does the same in one C call (:func:`shm.steps.push_rows`):
the record's head is packed here, its columns and the push time are written
by the C straight into the ring, and nothing is allocated for the record.

The two paths write the same bytes (``tests/test_step_path_c.py`` compares
them). ``RTE_PURE_PYTHON=1`` in the environment, read at import, turns the C
path off (:data:`IN_PLACE` False): :func:`push_step` then answers 0, which
is also its answer for a ring without room. :func:`send_step` is what the
daemon calls (rte/ipc/outbound.py): in place when it can, else the Python
path, whose record the connection pushes or queues behind earlier ones as
before (a record is never pushed past one that waits in the backlog).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from rte.protocol.latency import Histogram
from rte.protocol.wire import (
    _PUSHED_AT,
    HEADER,
    STEP,
    STEP_AT,
    RecordType,
    StepColumns,
    encode_step,
    stamp_pushed,
    step_of,
)
from shm import RingCorrupt
from shm.ring import Ring
from shm.segment import Segment
from shm.slab_core import SlabCore
from shm.steps import OTHER, RowsReader, RowsWriter, push_rows
from shm.words import Word

IN_PLACE = os.environ.get("RTE_PURE_PYTHON", "") != "1"
"""Whether STEP records go into rings in place (C), and clients judge them as
they pop them (:func:`step_reader`); ``RTE_PURE_PYTHON=1``: never."""

IN_PLACE_MIN_ROWS = 16
"""The fewest rows :func:`send_step` writes in place: below about 16 the Python
pack of a short record costs less than the C call's dozen cffi arguments
(measured on the 2-core box: 1 row 3.0 us Python against 4.0 us C; 64 rows
8.6 us against 6.0 us, encode and push together)."""

_HEAD = HEADER.pack(RecordType.STEP, 0, 0, 0, 0)
assert len(_HEAD) + STEP.size == STEP_AT and STEP_AT % 8 == 0  # the C needs an aligned head


def step_head(n: int, contiguous: bool, emitted_ns: int) -> bytes:
    """A STEP record's header and fixed part, pushed_ns 0 (the C stamps it)."""
    return _HEAD + STEP.pack(n, int(contiguous), emitted_ns, 0, 0)


def push_step(
    ring: Ring,
    slots: Any,
    generations: Any,
    chunks: Sequence[int],
    generated_ns: int | Sequence[int],
    handles: Sequence[int],
    *,
    contiguous: bool,
    emitted_ns: int,
    applied: Sequence[int] | None = None,
) -> int:
    """Push one STEP record (as :func:`~rte.protocol.wire.encode_step` would
    encode it) into ``ring`` in place; returns its pushed_ns, or 0 when nothing
    was pushed: the ring has no room, is garbled by its consumer, or the C
    path is off (:data:`IN_PLACE`). Then encode the record and queue it."""
    if not IN_PLACE:
        return 0
    head = step_head(len(slots), contiguous, emitted_ns)
    try:
        return push_rows(
            ring, head, _PUSHED_AT, slots, generations, chunks, generated_ns, handles, applied
        )
    except RingCorrupt:  # the client garbled its own ring: the caller's fallback counts it
        return 0


def send_step(
    ring: Ring,
    send: Callable[[bytearray], bool],
    queued: bool,
    slots: Any,
    generations: Any,
    chunks: Sequence[int],
    generated_ns: int | Sequence[int],
    handles: Sequence[int],
    *,
    contiguous: bool,
    emitted_ns: int,
    applied: Sequence[int] | None = None,
) -> int:
    """One STEP record to the client whose outbox is ``ring``: in place when
    nothing is ``queued`` before it, it has :data:`IN_PLACE_MIN_ROWS` rows or
    more and there is room (:func:`push_step`),
    else encoded (the Python reference) and given to ``send``, which pushes or
    queues it and says False when it lost it. Returns the record's pushed_ns
    (when it was stamped), or 0 when it was lost."""
    if not queued and len(slots) >= IN_PLACE_MIN_ROWS:
        pushed = push_step(
            ring,
            slots,
            generations,
            chunks,
            generated_ns,
            handles,
            contiguous=contiguous,
            emitted_ns=emitted_ns,
            applied=applied,
        )
        if pushed:
            return pushed
    encoded = encode_step(
        slots,
        generations,
        chunks,
        generated_ns,
        handles,
        contiguous=contiguous,
        emitted_ns=emitted_ns,
        applied=applied,
    )
    pushed = time.monotonic_ns()
    stamp_pushed(encoded, pushed)
    return pushed if send(encoded) else 0


def step_writer(
    ring: Ring, slab: SlabCore, delivery: Histogram, segment: Segment, figures: Any = None
) -> RowsWriter:
    """The daemon's writer of STEP records into one client's ``ring``
    (``shm_rows_send``): a step's slots in ``slab`` published, its record pushed
    in place, its emitted-to-pushed time added to ``delivery`` (the control
    block's histogram, in ``segment``) and its sessions' ``figures`` counted
    (``shm_figures_t *``, :meth:`rte.ipc.figures.SessionFigures.counted`; None:
    none), in one C call."""
    return RowsWriter(
        ring,
        slab,
        _PUSHED_AT,
        histogram=delivery.words,
        total=delivery.total,
        words_segment=segment,
        figures=figures,
    )


# -- the client's side ----------------------------------------------------------

NOT_JUDGED = OTHER
"""The verdict on every record the Python reference pops: decode it."""


def step_reader(
    ring: Ring,
    slab: SlabCore,
    handles: int,
    *,
    histogram: memoryview | None = None,
    owner: int = 0,
    counts: memoryview | None = None,
    starved: Word | None = None,
    given: Word | None = None,
) -> RowsReader:
    """The C reader of a client's outbox (``shm_rows_pop``): each record
    popped is judged in the same call, a STEP whole, its handles below
    ``handles`` and its slots published in ``slab`` getting the verdict that
    :func:`judged_step` may read it unchecked; the same call adds its
    pushed-to-taken time to ``histogram`` (the client block's). Its
    :meth:`~shm.steps.RowsReader.give_back` releases a judged STEP's rows for
    ``owner`` and credits them in ``counts`` (by handle), stamping ``given``
    with the time and clearing ``starved``."""
    return RowsReader(
        ring,
        slab,
        RecordType.STEP,
        STEP_AT,
        HEADER.size,
        handles,
        histogram=histogram,
        stamp_at=_PUSHED_AT,
        owner=owner,
        counts=counts,
        starved=starved,
        given=given,
    )


FIXED_AT = HEADER.size
"""Where a STEP's fixed part (:data:`~rte.protocol.wire.STEP`: n, flags,
emitted_ns, pushed_ns) begins: ``STEP.unpack_from(record, FIXED_AT)``."""


def judged_step(record: bytes) -> StepColumns:
    """The columns of a STEP record the C judged whole (:func:`step_reader`):
    :func:`~rte.protocol.wire.step_columns` without the checks the C made."""
    n, flags, emitted, pushed, _ = STEP.unpack_from(record, FIXED_AT)
    return step_of(record, n, flags, emitted, pushed)
