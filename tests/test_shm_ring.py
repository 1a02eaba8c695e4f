"""Ring in one process: edges, wrap, batch pop, blocking timeouts, corruption, statistics,
and a hypothesis model check of any interleaving of pushes and pops."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ring_rigs import OneRing

from shm import (
    RecordTooLarge,
    Ring,
    RingCorrupt,
    RingEmpty,
    RingFull,
    Segment,
    SegmentError,
    shm_name,
)
from shm.native import ffi
from shm.ring import RingStatistics
from shm.segment import HEADER_SIZE


@pytest.fixture
def rig(shm_prefix: str) -> Iterator[OneRing]:
    r = OneRing(shm_prefix, 256)
    yield r
    r.close()


def test_push_pop_in_order_across_many_wraps(rig: OneRing) -> None:
    ring = rig.ring
    for i in range(2000):
        record = bytes([i % 251]) * (i % 61)
        ring.push_nowait(record)
        if i % 3 == 0:
            ring.push_nowait(b"extra")
            assert ring.pop_nowait() == record
            assert ring.pop_nowait() == b"extra"
        else:
            assert ring.pop_nowait() == record
    stats = ring.statistics()
    assert stats.pushed == stats.popped and stats.used_bytes == 0
    assert stats.bytes_pushed == stats.bytes_popped


def test_full_and_empty_edges(rig: OneRing) -> None:
    ring = rig.ring
    with pytest.raises(RingEmpty):
        ring.pop_nowait()
    pushed = 0
    while True:
        try:
            ring.push_nowait(b"0123456789abcdef")  # 24 bytes a record
        except RingFull as exc:
            assert "the ring is full" in str(exc)
            break
        pushed += 1
    assert pushed == 256 // 24
    assert ring.statistics().full_events == 1
    assert ring.pop_nowait() == b"0123456789abcdef"
    ring.push_nowait(b"0123456789abcdef")  # room again after one pop
    assert len(ring.pop_batch_nowait()) == pushed
    assert ring.pop_batch_nowait() == []


def test_largest_record_fits_and_a_larger_one_is_refused(rig: OneRing) -> None:
    ring = rig.ring
    assert ring.max_record == 256 // 2 - 8
    for _ in range(5):  # at every offset, an empty ring takes the largest record
        ring.push_nowait(b"x" * 40)
        ring.pop_nowait()
        ring.push_nowait(b"L" * ring.max_record)
        assert ring.pop_nowait() == b"L" * ring.max_record
    with pytest.raises(RecordTooLarge, match="exceeds this ring's largest"):
        ring.push_nowait(b"x" * (ring.max_record + 1))
    with pytest.raises(RecordTooLarge):
        ring.push(b"x" * 1000, timeout=5)  # never waits for what can never fit
    assert ring.statistics().oversized == 2
    assert ring.pop_batch_nowait() == []


def test_blocking_forms_time_out_with_the_typed_errors(rig: OneRing) -> None:
    ring = rig.ring
    with pytest.raises(RingEmpty, match="stayed empty"):
        ring.pop(timeout=0.05)
    assert ring.pop_batch(timeout=0.05) == []
    while True:
        try:
            ring.push_nowait(b"y" * 100)
        except RingFull:
            break
    checks = []
    with pytest.raises(RingFull, match="stayed full"):
        ring.push(b"y" * 100, timeout=0.3, check=lambda: checks.append(1))
    assert checks  # a caller's liveness check runs while it waits
    assert ring.statistics().full_events == 2  # one per refused push, not per retry


def test_batch_pop_drains_everything_in_one_call(rig: OneRing) -> None:
    ring = rig.ring
    records = [bytes([i]) * i for i in range(1, 12)]
    for r in records:
        ring.push_nowait(r)
    assert ring.pop_batch_nowait(max_records=3) == records[:3]
    assert ring.pop_batch_nowait() == records[3:]


def test_peek_reads_without_consuming(rig: OneRing) -> None:
    ring = rig.ring
    ring.push_nowait(b"first")
    ring.push_nowait(b"second")
    assert ring.peek(0) == b"first"
    assert ring.peek(1) == b"second"
    assert ring.peek(2) is None
    assert ring.statistics().popped == 0
    assert ring.pop_nowait() == b"first"


def test_corrupt_bytes_are_reported_and_nothing_is_consumed(rig: OneRing) -> None:
    ring = rig.ring
    ring.push_nowait(b"good")
    length_field = rig.segment.bytes_at(HEADER_SIZE + 512, 8)
    length_field[:] = (10**9).to_bytes(8, "little")  # a scribbler
    with pytest.raises(RingCorrupt):
        ring.pop_nowait()
    with pytest.raises(RingCorrupt):
        ring.pop_batch_nowait()
    assert ring.statistics().corrupt == 2
    assert ring.statistics().waiting == 1
    ring.reset()  # the owner's remedy once both peers are stopped
    ring.push_nowait(b"after")
    assert ring.pop_nowait() == b"after"


def test_statistics_are_read_from_the_c_struct_by_name(rig: OneRing) -> None:
    c_fields = {name for name, _ in ffi.typeof("shm_ring_stats_t").fields}
    ours = {f.name for f in dataclasses.fields(RingStatistics)}
    derived = {"used_bytes", "high_water_bytes", "consumer_sleeping"}
    assert ours - derived <= c_fields  # every other field has its C namesake
    rig.ring.push_nowait(b"abc")
    stats = rig.ring.statistics()
    assert (stats.capacity, stats.pushed, stats.bytes_pushed, stats.used_bytes) == (256, 1, 3, 16)
    assert (stats.high_water_bytes, stats.waiting, stats.consumer_sleeping) == (16, 1, False)


def test_opening_a_ring_where_there_is_none_is_refused(shm_prefix: str) -> None:
    seg = Segment.create(shm_name(shm_prefix, "blank"), 2 * HEADER_SIZE)
    with pytest.raises(SegmentError, match=r"opening the ring at offset .* nothing is laid out"):
        Ring(seg, HEADER_SIZE, policy="spin")
    with pytest.raises(ValueError, match="power of two"):
        Ring.create(seg, HEADER_SIZE, 1000, policy="spin")
    with pytest.raises(ValueError, match="needs a doorbell"):
        Ring.create(seg, HEADER_SIZE, 1024)
    seg.close()
    seg.unlink()


ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 130)),
        st.tuples(st.just("pop"), st.just(0)),
        st.tuples(st.just("batch"), st.integers(1, 20)),
    ),
    max_size=300,
)


# One ring for all examples on purpose: each example starts where the last left
# the head and tail (the final drain empties it), so wraps land at varied offsets.
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops)
def test_any_interleaving_matches_a_fifo_model(
    rig: OneRing, sequence: list[tuple[str, int]]
) -> None:
    ring = rig.ring
    model: collections.deque[bytes] = collections.deque()
    assert ring.statistics().used_bytes == 0
    counter = 0
    for op, arg in sequence:
        if op == "push":
            record = counter.to_bytes(4, "little") * (arg // 4) + b"\x00" * (arg % 4)
            counter += 1
            try:
                ring.push_nowait(record)
            except RecordTooLarge:
                assert arg > ring.max_record
                continue
            except RingFull:
                continue
            model.append(record)
        elif op == "pop":
            if model:
                assert ring.pop_nowait() == model.popleft()
            else:
                with pytest.raises(RingEmpty):
                    ring.pop_nowait()
        else:
            got = ring.pop_batch_nowait(max_records=arg)
            want = [model.popleft() for _ in range(min(arg, len(model)))]
            assert got == want
    assert ring.pop_batch_nowait() == list(model)
