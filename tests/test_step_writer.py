"""A daemon's step out in one C call (:class:`shm.steps.RowsWriter`, ``shm_rows_send``).

What the writer does must be what the three calls it stands for did: the
slots published, the record the Python reference encodes pushed in place,
its emitted-to-pushed time in the delivery histogram (as
:meth:`~rte.protocol.latency.Histogram.add` adds it) and one emitted chunk per
row counted. A slot reclaimed meanwhile pushes nothing and counts nothing; a
full ring leaves the slots published for the caller to queue the record; a
closed segment is refused before the C reaches it. Each test runs on a real
slab and ring in shared memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from rte.protocol.latency import BUCKETS, Histogram, bucket
from rte.protocol.steps import step_head, step_writer
from rte.protocol.wire import encode_step, stamp_pushed
from shm import Ring, Segment, SegmentError, Slab
from shm.batch import BatchLoan
from shm.segment import HEADER_SIZE
from shm.steps import RowsWriter

CAPACITY = 1 << 13
SLOTS, OWNER = 400, 1
SHAPE, DTYPE = (4,), np.dtype(np.float32)


@dataclass
class Rig:
    segment: Segment
    ring: Ring
    slab: Slab
    delivery: Histogram
    writer: RowsWriter
    counts: np.ndarray

    def loan(self, n: int) -> BatchLoan:
        loan = self.slab.loan_batch(OWNER, n, DTYPE, SHAPE)
        for k, row in enumerate(loan.rows):
            row[...] = k
        return loan

    def send(self, loan: BatchLoan, handles: list[int], applied: list[int] | None) -> int:
        n = len(loan)
        return self.writer.send(
            step_head(n, loan.contiguous, 1_000),
            loan.slots,
            loan.generations,
            list(range(n)),
            55,
            handles,
            applied,
            1_000,
            self.counts,
        )


@pytest.fixture
def rig(shm_prefix: str) -> Iterator[Rig]:
    ring_at = HEADER_SIZE
    slab_at = ring_at + Ring.footprint(CAPACITY)
    slab_at += -slab_at % 128
    words_at = slab_at + Slab.footprint(slab_at, SLOTS, 512, 4)
    words_at += -words_at % 8
    size = words_at + 8 * (BUCKETS + 1)
    segment = Segment.create(f"{shm_prefix}writer", size)
    try:
        ring = Ring.create(segment, ring_at, CAPACITY, policy="spin")
        slab = Slab.create(segment, slab_at, slots=SLOTS, slot_bytes=512, max_owners=4)
        words = segment.bytes_at(words_at, 8 * (BUCKETS + 1)).cast("Q")
        delivery = Histogram(words[:BUCKETS], words[BUCKETS:])
        counts = np.zeros(8, np.int64)
        writer = step_writer(ring, slab, delivery, segment)
        yield Rig(segment, ring, slab, delivery, writer, counts)
    finally:
        segment.close()
        segment.unlink()


@pytest.mark.parametrize("n", [1, 3, 64])
@pytest.mark.parametrize("receipts", [False, True])
def test_one_call_publishes_pushes_the_reference_record_and_counts_it(
    rig: Rig, n: int, receipts: bool
) -> None:
    loan = rig.loan(n)
    handles = [k % 8 for k in range(n)]
    applied = [9] * n if receipts else None
    pushed = rig.send(loan, handles, applied)
    assert pushed > 1_000
    reference = encode_step(
        loan.slots,
        loan.generations,
        list(range(n)),
        55,
        handles,
        contiguous=loan.contiguous,
        emitted_ns=1_000,
        applied=applied,
    )
    stamp_pushed(reference, pushed)
    assert rig.ring.pop_nowait() == bytes(reference)
    sample = rig.slab.receive_batch(OWNER, loan.slots, loan.generations, DTYPE, SHAPE)
    np.testing.assert_array_equal(np.stack(sample.rows)[:, 0], np.arange(n))  # published
    expected = np.zeros(BUCKETS, np.int64)
    expected[bucket(pushed - 1_000)] = 1
    np.testing.assert_array_equal(rig.delivery.counts(), expected)
    assert rig.delivery.total is not None and rig.delivery.total[0] == pushed - 1_000
    np.testing.assert_array_equal(rig.counts, np.bincount(handles, minlength=8))


def test_a_slot_reclaimed_meanwhile_pushes_and_counts_nothing(rig: Rig) -> None:
    loan = rig.loan(3)
    rig.slab.reclaim(OWNER)  # its client was taken for dead
    assert rig.send(loan, [0, 1, 2], None) == -1
    assert rig.ring.used() == 0
    assert not rig.counts.any() and not rig.delivery.counts().any()


def test_a_full_ring_leaves_the_slots_published_for_the_caller_to_queue(rig: Rig) -> None:
    pushed_rows = 0
    for n in (64, 1):  # fill the ring: big records first, then one-row ones
        while rig.send(loan := rig.loan(n), [3] * n, None) > 0:
            pushed_rows += n
    assert rig.ring.used() > CAPACITY // 2
    assert rig.slab.receive_batch(OWNER, loan.slots, loan.generations, DTYPE, SHAPE)  # published
    assert rig.counts[3] == pushed_rows  # and only what was pushed was counted
    assert rig.delivery.counts().sum() == rig.ring.statistics().pushed


def test_columns_of_other_lengths_and_closed_segments_are_refused(rig: Rig) -> None:
    loan = rig.loan(2)
    with pytest.raises(ValueError, match="every column"):
        rig.send(loan, [0], None)
    rig.segment.close()
    with pytest.raises(SegmentError):
        rig.send(loan, [0, 1], None)
