"""A peer that writes over a ring's or a slab's header in shared memory cannot
make this process touch a byte outside what it opened: the geometry is read
once, at open, and every index is checked against it (issue 20, item 2)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator

import pytest

from shm import Ring, RingCorrupt, Segment, Slab
from shm.native import lib
from shm.segment import HEADER_SIZE

CAPACITY = 1024
_RING_CAPACITY, _RING_MASK, _RING_MAX = 8, 16, 24  # words of the ring's header
_SLAB_SLOTS, _SLAB_OWNERS, _SLAB_QUOTA = 8, 16, 32  # words of the slab's header


@pytest.fixture
def segment(shm_prefix: str) -> Iterator[Segment]:
    made = Segment.create(f"{shm_prefix}.scribble", HEADER_SIZE + 64 * 1024)
    try:
        yield made
    finally:
        made.close()
        made.unlink()


def _scribble(segment: Segment, offset: int, value: int) -> None:
    lib.shm_store_release(segment.word(offset), value)


def test_a_ring_whose_peer_doubles_its_capacity_stays_in_its_bytes(segment: Segment) -> None:
    first = Ring.create(segment, HEADER_SIZE, CAPACITY, policy="spin")
    after = HEADER_SIZE + Ring.footprint(CAPACITY)
    neighbour = Ring.create(segment, after, CAPACITY, policy="spin")
    neighbour.push_nowait(b"untouched")
    before = bytes(segment.bytes_at(after, Ring.footprint(CAPACITY)))
    # the peer says the ring is four times as big: pushes would run into the neighbour
    _scribble(segment, HEADER_SIZE + _RING_CAPACITY, 4 * CAPACITY)
    _scribble(segment, HEADER_SIZE + _RING_MASK, 4 * CAPACITY - 1)
    _scribble(segment, HEADER_SIZE + _RING_MAX, 2 * CAPACITY - 8)
    pushed = 0
    while pushed < 100:
        try:
            first.push_nowait(bytes(range(200)))
        except Exception:  # full (or refused): the ring is as big as it was made
            break
        pushed += 1
        first.pop_nowait()  # keep it moving round, past where it really ends
    assert pushed == 100
    assert bytes(segment.bytes_at(after, Ring.footprint(CAPACITY))) == before
    assert neighbour.pop_nowait() == b"untouched"


def test_a_record_that_would_run_past_the_ring_is_corrupt_not_read(segment: Segment) -> None:
    ring = Ring.create(segment, HEADER_SIZE, CAPACITY, policy="spin")
    ring.push_nowait(b"x" * 8)
    data = HEADER_SIZE + 512  # the ring's bytes begin after its 512-byte header
    # a length that fits max_payload but, from near the end, runs past the ring's bytes
    _scribble(segment, HEADER_SIZE + 128, CAPACITY + CAPACITY - 16)  # head
    _scribble(segment, HEADER_SIZE + 256, CAPACITY - 16)  # tail, 16 bytes before the end
    _scribble(segment, data + CAPACITY - 16, CAPACITY // 2 - 8)
    with pytest.raises(RingCorrupt):
        ring.pop_nowait()


def _reclaim_after_scribble(name: str, offset: int, word: int, value: int) -> None:
    segment = Segment.open(name)
    slab = Slab(segment, offset)
    _scribble(segment, offset + word, value)
    slab.reclaim(0)  # walks the slots the slab was opened with, not what the header says now
    loan = slab.loan(0, "uint8", (16,))
    loan.publish()
    assert slab.slot(loan.ref.slot).owner == 0
    segment.close()


@pytest.mark.parametrize(
    ("word", "value"),
    [(_SLAB_SLOTS, 1 << 31), (_SLAB_OWNERS, 1 << 19), (_SLAB_QUOTA, 0)],
    ids=["slots", "owners", "quota"],
)
def test_a_slab_header_written_over_is_not_trusted(segment: Segment, word: int, value: int) -> None:
    Slab.create(segment, HEADER_SIZE, slots=4, slot_bytes=4096, max_owners=2)
    fork = multiprocessing.get_context("fork")  # a crash must fail the test, not end pytest
    child = fork.Process(
        target=_reclaim_after_scribble, args=(segment.name, HEADER_SIZE, word, value)
    )
    child.start()
    child.join(30)
    assert child.exitcode == 0
