"""Views of shared memory at the shm layer: every layout checked before anything is
mapped (issue 20, item 2), and a step's rows read from their own slots whatever
their order (item 8). Real segments and slabs, a writer and a reader mapping.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from shm import LayoutError, Segment, SegmentError, ShmError, Slab, SlotRef, one_run, shm_name
from shm.batch import BatchLoan
from shm.segment import HEADER_SIZE

SLOTS, SLOT = 16, 4096
ROW = ("u4", (1024,))  # one slot's worth


@pytest.fixture
def slabs(shm_prefix: str) -> Iterator[tuple[Slab, Slab]]:
    """(writer, reader) over one slab of 16 slots of 4 KiB."""
    name = shm_name(shm_prefix, "views")
    segment = Segment.create(name, HEADER_SIZE + Slab.footprint(HEADER_SIZE, SLOTS, SLOT, 2))
    try:
        writer = Slab.create(segment, HEADER_SIZE, slots=SLOTS, slot_bytes=SLOT, max_owners=2)
        reader = Slab.open_reader(name, HEADER_SIZE)
        yield writer, reader
        reader.segment.close()
    finally:
        segment.close()
        segment.unlink()


def words(values: list[int]) -> memoryview:
    return memoryview(np.array(values, np.uint64).tobytes()).cast("Q")


# -- item 8: "one run" looks at every slot -------------------------------------------------


@pytest.mark.parametrize(
    ("slots", "run"),
    [
        ([10, 11, 12, 13], True),
        ([10, 12, 11, 13], False),  # the endpoints alone say "run"
        ([13, 12, 11, 10], False),
        ([10, 10, 12], False),
        ([10, 11, 11, 13], False),
        ([7], True),
        ([7, 8], True),
        ([8, 7], False),
        ([], False),
    ],
)
def test_one_run_looks_at_every_slot(slots: list[int], run: bool) -> None:
    assert one_run(slots) is run
    assert one_run(words(slots)) is run
    assert one_run(np.array(slots, np.uint64)) is run


def test_one_run_in_c_over_words_answers_as_the_python_over_a_list() -> None:
    """A batch's words (memoryview, uint64 array) are judged in C (shm_one_run);
    any other sequence in Python: the same answer, random runs and near-runs."""
    rng = np.random.default_rng(27)
    for _ in range(400):
        n = int(rng.integers(3, 80))
        first = int(rng.integers(0, 1 << 40))
        slots = list(range(first, first + n))
        if rng.random() < 0.6:  # a near-run: endpoints kept, one inner slot moved
            k = int(rng.integers(1, n - 1))
            slots[k] += int(rng.choice([-1, 1, 2, n]))
        expected = slots == list(range(slots[0], slots[0] + n))
        assert one_run(slots) is expected
        assert one_run(words(slots)) is expected
        assert one_run(np.array(slots, np.uint64)) is expected
        assert one_run(np.repeat(np.array(slots, np.uint64), 2)[::2]) is expected  # strided


def test_a_step_of_scattered_slots_shows_each_row_its_own_slot(slabs: tuple[Slab, Slab]) -> None:
    """A step that merges two leases on a fragmented slab names slots [10, 12, 11, 13]:
    every row, the writer's and the reader's, is that slot's bytes."""
    writer, reader = slabs
    every = writer.loan_batch(0, 14, *ROW)  # slots 0-13, WRITING
    assert list(every.slots) == list(range(14))
    order = [10, 12, 11, 13]
    generations = [int(every.generations[s]) for s in order]
    step = BatchLoan(writer, 0, words(order), words(generations), np.dtype(ROW[0]), ROW[1])
    assert not step.contiguous and step.block is None
    for row, slot in zip(step.rows, order, strict=True):
        row[:] = 1000 + slot  # the writer's row i is slot order[i]
    every.publish()
    for slot in order:  # each slot holds its own value, read alone
        alone = reader.receive(SlotRef(slot, int(every.generations[slot]), 0), *ROW)
        assert int(alone.array[0]) == 1000 + slot
    sample = reader.receive_batch(0, words(order), words(generations), *ROW)
    assert not sample.contiguous and sample.block is None
    assert [int(row[0]) for row in sample.rows] == [1000 + s for s in order]
    assert [int(row[-1]) for row in sample.rows] == [1000 + s for s in order]
    run = [10, 11, 12, 13]
    ran = reader.receive_batch(0, words(run), words([int(every.generations[s]) for s in run]), *ROW)
    assert ran.contiguous and ran.block is not None  # a real run is still one array
    assert [int(row[0]) for row in ran.rows] == [1000 + s for s in run]
    assert sample.release() == 4


def test_a_batch_knows_once_whether_its_slots_are_one_run(slabs: tuple[Slab, Slab]) -> None:
    """Issue 22: a loan's ``contiguous`` is one_run's answer, decided when the loan is
    made, and read-only, so the callers above carry it instead of asking again."""
    writer, reader = slabs
    loan = writer.loan_batch(0, 3, *ROW)
    assert loan.contiguous is one_run(loan.slots) is True and loan.block is not None
    with pytest.raises(AttributeError):
        loan.contiguous = False  # type: ignore[misc]
    loan.publish()
    sample = reader.receive_batch(0, loan.slots, loan.generations, *ROW)
    assert sample.contiguous is True
    with pytest.raises(AttributeError):
        sample.contiguous = False  # type: ignore[misc]
    assert sample.release() == 3


# -- item 2: every layout is checked before anything is mapped -----------------------------

BAD_ANYWHERE: list[tuple[Any, Any]] = [
    ("u1", (-1, 3)),  # np.frombuffer read a negative count as "the rest of the segment"
    ("u1", (-2, -3)),  # a positive product of negatives
    ("u1", (0,)),
    ("u1", (3, 0)),
    ("u1", (2.0, 3)),
    ("u1", (True, 3)),
    ("u1", [2, 3]),
    ("u1", "abc"),
    ("u1", None),
    ("u1", (2**40, 2**40)),  # overflows any C size
    (object, (2,)),  # pointers read out of shared memory
    ("O", (2,)),
    ([("a", "u1"), ("b", "O")], (2,)),
    ("S", (4,)),  # no size
    ("(3,)f4", (2,)),  # a sub-shape
    ("no-such-dtype", (2,)),
]
BAD_LAYOUTS = [*BAD_ANYWHERE, ("u1", (SLOT + 1,)), ("u4", (SLOT // 4, 2))]  # past a slot


@pytest.mark.parametrize(("dtype", "shape"), BAD_LAYOUTS)
def test_a_bad_layout_is_refused_and_nothing_is_taken(
    slabs: tuple[Slab, Slab], dtype: Any, shape: Any
) -> None:
    writer, reader = slabs
    published = writer.loan(1, *ROW).publish()
    before = writer.statistics()
    with pytest.raises(LayoutError, match="slot of"):
        writer.loan(0, dtype, shape)
    with pytest.raises(LayoutError, match="slot of"):
        writer.loan_batch(0, 2, dtype, shape)
    with pytest.raises(LayoutError, match="slot of"):
        reader.receive(published, dtype, shape)
    slot, generation = words([published.slot]), words([published.generation])
    with pytest.raises(LayoutError, match="slot of"):
        reader.receive_batch(1, slot, generation, dtype, shape)
    assert writer.statistics() == before  # nothing taken, nothing released
    assert writer.held(0) == 0


def test_layout_errors_are_shm_and_value_errors() -> None:
    assert issubclass(LayoutError, ShmError) and issubclass(LayoutError, ValueError)


def test_segment_views_check_every_offset_count_and_shape(slabs: tuple[Slab, Slab]) -> None:
    segment = slabs[0].segment
    u1 = np.dtype("u1")
    for offset, count in [
        (HEADER_SIZE, -1),  # np.frombuffer's "all the rest"
        (HEADER_SIZE, 0),
        (HEADER_SIZE - 1, 1),  # the header
        (-8, 1),
        (segment.size - 1, 2),  # past the end
        (segment.size, 1),
    ]:
        with pytest.raises(LayoutError, match=segment.name):
            segment.view(offset, u1, count, (count,), readonly=True)
    with pytest.raises(LayoutError):
        segment.view(HEADER_SIZE, np.dtype(object), 1, (1,), readonly=True)
    with pytest.raises(LayoutError, match="does not hold"):
        segment.view(HEADER_SIZE, u1, 6, (4,), readonly=True)
    for dtype, shape in BAD_ANYWHERE:
        if isinstance(shape, list):
            continue  # array() takes a list for a shape
        with pytest.raises(LayoutError):
            segment.array(HEADER_SIZE, dtype, shape, readonly=True)
    with pytest.raises(LayoutError, match="outside"):
        segment.array(segment.size + 4096, "u1", (1,), readonly=True)
    with pytest.raises(LayoutError, match="exceed"):
        segment.array(segment.size - 4, "u4", (2,), readonly=True)
    assert segment.array(segment.size - 4, "u4", (1,), readonly=True).shape == (1,)
    for offset, size in [(-8, 8), (0, -1), (segment.size - 4, 8)]:
        with pytest.raises(LayoutError):
            segment.bytes_at(offset, size)
    with pytest.raises(SegmentError):
        segment.ptr(-1)
    rows = segment.rows  # a slab's rows: never more than a stride, never past the end
    with pytest.raises(LayoutError):
        rows(HEADER_SIZE, 2, 8, u1, (9,), readonly=True)
    with pytest.raises(LayoutError):
        rows(HEADER_SIZE, 0, 8, u1, (8,), readonly=True)
    with pytest.raises(LayoutError):
        rows(segment.size - 8, 2, 8, u1, (8,), readonly=True)
