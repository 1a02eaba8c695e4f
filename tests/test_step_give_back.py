"""A client's STEP records timed as they are popped, and given back in one C call.

:class:`shm.steps.RowsReader` pops and judges a ring's records in one call
(``shm_rows_pop``), which also adds each ready record's push-to-pop time to a
histogram in shared memory; ``give_back`` (``shm_rows_give_back``) releases a
judged record's slots and credits its rows, reading the record's own columns.
The Python reference is :class:`shm.BatchSample`'s release, then
:class:`shm.Counts` and the starved word's ``cas``: the same slots, the same
credits, the same refusals. Behaviour only: nothing here times anything.
"""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from rte.contract import Notice, NoticeKind
from rte.protocol import latency
from rte.protocol.steps import judged_step, step_reader
from rte.protocol.wire import encode_notice, encode_step, stamp_pushed
from shm import Counts, Ring, Segment, Slab
from shm.segment import HEADER_SIZE
from shm.steps import OTHER, RowsReader, log_bucket
from shm.words import Word

CAPACITY = 1 << 13
HANDLES = 4
WORDS = latency.BUCKETS + HANDLES + 1  # histogram, counts, the starved word


@dataclass
class Rig:
    ring: Ring
    slab: Slab
    histogram: memoryview
    counts: memoryview
    starved: Word
    reader: RowsReader

    def step(self, handles: list[int], owner: int = 0) -> bytes:
        """A STEP of ``len(handles)`` published slots of ``owner``, pushed and popped."""
        loan = self.slab.loan_batch(owner, len(handles), "u1", (4,))
        loan.publish()
        record = encode_step(
            loan.slots,
            loan.generations,
            list(range(len(handles))),
            5,
            handles,
            contiguous=loan.contiguous,
            emitted_ns=1,
        )
        stamp_pushed(record, 2)
        self.ring.push_nowait(bytes(record))
        (raw, first), *more = self.reader.pop()
        assert not more and first != OTHER
        return raw


@pytest.fixture
def rig(shm_prefix: str) -> Iterator[Rig]:
    words_at = HEADER_SIZE + Ring.footprint(CAPACITY)
    mailbox = Segment.create(f"{shm_prefix}mailbox", words_at + 8 * WORDS)
    size = HEADER_SIZE + Slab.footprint(HEADER_SIZE, 8, 64, 2)
    slab_segment = Segment.create(f"{shm_prefix}slab", size)
    try:
        ring = Ring.create(mailbox, HEADER_SIZE, CAPACITY, policy="spin")
        slab = Slab.create(slab_segment, HEADER_SIZE, slots=8, slot_bytes=64, max_owners=2, quota=8)
        words = mailbox.bytes_at(words_at, 8 * WORDS).cast("Q")
        histogram, counts = words[: latency.BUCKETS], words[latency.BUCKETS : -1]
        starved = mailbox.atomic(words_at + 8 * (WORDS - 1))
        reader = step_reader(
            ring, slab, HANDLES, histogram=histogram, owner=0, counts=counts, starved=starved
        )
        yield Rig(ring, slab, histogram, counts, starved, reader)
    finally:
        for segment in (mailbox, slab_segment):
            segment.close()
            segment.unlink()


def test_the_c_buckets_are_the_histograms_buckets() -> None:
    edges = [v for bits in range(64) for v in ((1 << bits) - 1, 1 << bits, (1 << bits) + 1)]
    values = [-5, 0, 1, 127, 128, 129, *edges, *random.Random(7).sample(range(1 << 62), 500)]
    for ns in (min(v, (1 << 63) - 1) for v in values):
        assert log_bucket(ns, latency.BUCKETS) == latency.bucket(ns), ns


def test_each_ready_record_popped_is_timed_once_and_no_other(rig: Rig) -> None:
    rig.step([0, 1])
    assert sum(rig.histogram) == 1
    rig.ring.push_nowait(encode_notice(Notice("s", NoticeKind.ERROR, "x", 0), 256))
    assert [first for _, first in rig.reader.pop()] == [OTHER]
    assert sum(rig.histogram) == 1  # a notice is not a delivery of chunks
    stamp = time.monotonic_ns()  # pushed 2 ns after the clock's epoch: timed from there
    assert list(rig.histogram).index(1) >= latency.bucket(stamp // 2)


def _reference(rig: Rig, record: bytes, rows: np.ndarray | None) -> bool:
    """The Python reference's give back: the sample's release, the credits, the feed."""
    step = judged_step(record)
    sample = rig.slab.receive_batch(0, step.slots, step.generations, "u1", (4,))
    if rows is None:
        sample.release()
    else:
        sample.release_rows(rows)
    Counts(rig.counts).add_ones(array("I", step.handles), rows)
    return bool(rig.starved.cas(1, 0))


def _after(rig: Rig, give_back: Callable[[bytes], bool | None]) -> tuple[object, ...]:
    """What a give back of a fresh step's rows changes: slots held, counts, the
    answer, the starved word."""
    record = rig.step([3, 0, 3])
    rig.starved.store(1)
    held, counts = rig.slab.held(0), list(rig.counts)
    answer = give_back(record)
    after = [c - b for c, b in zip(rig.counts, counts, strict=True)]
    return held - rig.slab.held(0), after, answer, rig.starved.load()


@pytest.mark.parametrize("rows", [None, [2], [0, 2], [2, 0, 1], [1, 9, -1]])
def test_one_call_gives_back_and_credits_as_the_reference_does(
    rig: Rig, rows: list[int] | None
) -> None:
    picked = None if rows is None else np.array(rows, np.int64)
    if rows is not None and max(rows) >= 3:  # out of range: skipped, as add_ones skips them
        reference = _after(rig, lambda r: _reference(rig, r, np.array([1], np.int64)))
    else:
        reference = _after(rig, lambda r: _reference(rig, r, picked))
    assert _after(rig, lambda r: rig.reader.give_back(r, picked)) == reference
    assert reference[2] is True and reference[3] == 0  # the writer waited: rung, cleared


def test_a_slot_given_back_twice_or_not_ours_credits_nothing(rig: Rig) -> None:
    record = rig.step([1, 2])
    assert rig.reader.give_back(record) is False  # nobody starved
    assert list(rig.counts) == [0, 1, 1, 0]
    assert rig.reader.give_back(record) is None  # stale now: nothing credited again
    assert list(rig.counts) == [0, 1, 1, 0]
    other = step_reader(rig.ring, rig.slab, HANDLES, owner=1, counts=rig.counts)
    mine = rig.step([0])
    assert other.give_back(mine) is None  # owner 0's slot: refused, uncredited
    assert rig.slab.held(0) == 1 and list(rig.counts) == [0, 1, 1, 0]
    assert rig.reader.give_back(mine) is False and rig.slab.held(0) == 0


def test_a_give_back_without_credit_only_releases(rig: Rig) -> None:
    record = rig.step([1, 2])
    rig.starved.store(1)
    assert rig.reader.give_back(record, credit=False) is False
    assert rig.slab.held(0) == 0 and list(rig.counts) == [0, 0, 0, 0]
    assert rig.starved.load() == 1  # the caller credits what stands, then feeds


def test_a_reader_refuses_words_outside_its_rings_segment(rig: Rig) -> None:
    elsewhere = memoryview(bytearray(8 * HANDLES)).cast("Q")
    with pytest.raises(ValueError, match="ring's own segment"):
        step_reader(rig.ring, rig.slab, HANDLES, counts=elsewhere)
