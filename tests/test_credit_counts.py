"""shm.Counts: a batch's credits laid down in one C call, in shared memory."""

from __future__ import annotations

import os
import uuid
from array import array
from collections.abc import Iterator

import numpy as np
import pytest
from child_python import python_c

from shm import Counts, Segment, shm_name
from shm.segment import HEADER_SIZE


@pytest.fixture
def words() -> Iterator[memoryview]:
    segment = Segment.create(
        shm_name(f"counts{os.getpid()}x{uuid.uuid4().hex[:8]}", "words"), HEADER_SIZE + 8 * 8
    )
    try:
        yield segment.bytes_at(HEADER_SIZE, 8 * 8).cast("Q")
    finally:
        segment.close()
        segment.unlink()


def test_each_index_gets_one(words: memoryview) -> None:
    counts = Counts(words)
    assert counts.add_ones(array("I", [3, 0, 5])) == 3
    assert counts.add_ones(array("I", [3])) == 1
    assert list(words) == [1, 0, 0, 2, 0, 1, 0, 0]


def test_rows_pick_positions_of_the_index(words: memoryview) -> None:
    counts = Counts(words)
    index = array("I", [7, 6, 5, 4])
    assert counts.add_ones(index, np.array([0, 2], np.intp)) == 2
    assert counts.add_ones(index, np.array([], np.int64)) == 0
    assert list(words) == [0, 0, 0, 0, 0, 1, 0, 1]


def test_out_of_range_is_skipped_not_written(words: memoryview) -> None:
    counts = Counts(words)
    assert counts.add_ones(array("I", [8, 1, 1_000_000])) == 1
    assert counts.add_ones(array("I", [2, 3]), np.array([-1, 2, 1], np.int64)) == 1
    assert list(words) == [0, 1, 0, 1, 0, 0, 0, 0]


def test_a_read_only_or_foreign_view_is_refused(words: memoryview) -> None:
    with pytest.raises(ValueError, match="writable memoryview of uint64"):
        Counts(words.toreadonly())
    with pytest.raises(ValueError, match="writable memoryview of uint64"):
        Counts(words.cast("B"))


PROBE = """
import gc, sys
from array import array
from shm import Counts, Segment
from shm.segment import HEADER_SIZE
segment = Segment.create(sys.argv[1], HEADER_SIZE + 64)
segment.unlink()
words = segment.bytes_at(HEADER_SIZE, 64).cast("Q")
counts = Counts(words)
counts.add_ones(array("I", [1]))
class Transport:  # a transport's objects, held in a cycle as a client's are
    pass
t = Transport()
t.counts, t.words, t.segment, t.me = counts, words, segment, t
segment.close()
del counts, words, segment, t
gc.collect()
print("collected")
"""


def test_counts_collected_in_a_cycle_after_their_segment_closed_never_crash() -> None:
    """A Counts kept a C pointer for life (a from_buffer export of its view): the
    cycle collector could not clear the view, freed it under the export, and the
    process died of SIGSEGV (a pool client whose lost member was closed, in CI)."""
    name = shm_name(f"counts{os.getpid()}x{uuid.uuid4().hex[:8]}", "probe")
    done = python_c(PROBE, name)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout == "collected\n" and "Exception ignored" not in done.stderr, done.stderr


def test_counts_over_a_released_view_add_nothing(words: memoryview) -> None:
    view = words[:4]
    counts = Counts(view)
    view.release()
    assert counts.add_ones(array("I", [0, 1])) == 0
    assert list(words) == [0] * 8
