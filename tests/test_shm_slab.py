"""Slab: zero-copy handoff across processes, loans and samples that manage themselves,
generations, quotas, dead-owner reclaim."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest
import shm_workers
from child_python import python_c

from shm import (
    ForeignSlot,
    QuotaExceeded,
    Segment,
    SegmentError,
    Slab,
    SlabFull,
    SlotRef,
    SlotState,
    StaleSlot,
    shm_name,
)
from shm.segment import HEADER_SIZE

SPAWN = multiprocessing.get_context("spawn")
SHAPE = (256, 256)  # 256 KiB of float32
BYTE = (np.uint8, (4,))  # the smallest loan, where the bytes do not matter


@pytest.fixture
def slab(shm_prefix: str) -> Iterator[Slab]:
    size = HEADER_SIZE + Slab.footprint(HEADER_SIZE, 4, 4 * 256 * 256, 8)
    segment = Segment.create(shm_name(shm_prefix, "slab"), size)
    yield Slab.create(
        segment, HEADER_SIZE, slots=4, slot_bytes=4 * 256 * 256, max_owners=8, quota=3
    )
    segment.close()
    segment.unlink()


def test_reader_in_another_process_sees_the_slab_memory_itself(slab: Slab) -> None:
    loan = slab.loan(2, np.float32, SHAPE)
    data = loan.array
    data[:] = 1.5
    ref = loan.publish()
    assert ref == loan.ref and ref.owner == 2
    parent, child = SPAWN.Pipe()
    reader = SPAWN.Process(
        target=shm_workers.read_slot, args=(slab.segment.name, slab.offset, ref, child)
    )
    reader.start()
    assert parent.poll(30)
    seen = parent.recv()
    low, high = seen["segment"]
    assert low <= seen["address"] < high  # the reader's array lies inside its slab mapping
    assert seen["address"] - low == slab.data_offset + ref.slot * slab.slot_size
    assert seen["readonly"] and seen["first"] == 1.5
    data[0, 0] = 42.0  # written after the reader took its view...
    parent.send("look again")
    assert parent.poll(30)
    assert parent.recv() == 42.0  # ...and seen through that same view: no copy was made
    parent.send("release")
    assert parent.poll(30)
    assert parent.recv() == "StaleSlot"  # a raw second release of the same generation
    reader.join(30)
    assert reader.exitcode == 0
    info = slab.slot(ref.slot)
    assert info.state is SlotState.FREE and info.generation == ref.generation + 1
    stats = slab.statistics()
    assert (stats.acquired, stats.released, stats.stale_refused, stats.held) == (1, 1, 1, 0)


def test_stale_generation_and_foreign_owner_releases_are_refused(slab: Slab) -> None:
    first = slab.loan(1, *BYTE).publish()
    slab.release(first)
    again = slab.loan(1, *BYTE).publish()  # maybe the same slot, at a newer generation
    with pytest.raises(StaleSlot, match=r"release of slot .* by owner 1"):
        slab.release(first)
    with pytest.raises(ForeignSlot, match="another owner"):
        slab.release(again._replace(owner=5))
    with pytest.raises(StaleSlot, match="is ready at generation"):
        slab.receive(again._replace(generation=again.generation + 1), *BYTE)
    with pytest.raises(StaleSlot, match="does not exist"):
        slab.receive(SlotRef(99, 0, 1), *BYTE)
    with pytest.raises(StaleSlot, match="does not exist"):
        slab.release(SlotRef(99, 0, 1))
    with pytest.raises(ValueError, match="owners are 0-7"):
        slab.release(again._replace(owner=8))
    assert slab.slot(again.slot).state is SlotState.READY  # nothing refused changed anything
    with pytest.raises(ValueError, match="exceed a slot"):
        slab.receive(again, np.float64, SHAPE)
    stats = slab.statistics()
    assert (stats.stale_refused, stats.foreign_refused) == (1, 1)


def test_quota_stalls_only_its_owner_and_full_is_typed(slab: Slab) -> None:
    held = [slab.loan(0, *BYTE) for _ in range(3)]
    with pytest.raises(QuotaExceeded, match="quota of 3"):
        slab.loan(0, *BYTE)
    other = slab.loan(1, *BYTE)  # another owner is not held back
    with pytest.raises(SlabFull, match="every slot"):
        slab.loan(2, *BYTE)
    other.abort()
    slab.loan(2, *BYTE)
    with pytest.raises(ValueError, match="exceed a slot"):
        slab.loan(3, np.float64, SHAPE)  # refused before any slot is taken
    with pytest.raises(ValueError, match="past the slab's"):
        slab.loan(8, *BYTE)
    stats = slab.statistics()
    assert (stats.quota_refused, stats.full_events, stats.aborted, stats.held) == (1, 1, 1, 4)
    assert slab.held(0) == 3 and len(held) == 3 and slab.held(3) == 0


def test_a_loan_left_unfinished_by_an_exception_is_aborted(slab: Slab) -> None:
    with pytest.raises(RuntimeError, match="model failed"), slab.loan(1, *BYTE) as loan:
        loan.array[:] = 7
        raise RuntimeError("model failed")
    assert loan.finished
    assert slab.slot(loan.ref.slot).state is SlotState.FREE
    with slab.loan(1, *BYTE) as unpublished:
        pass  # leaving without publishing gives the slot back too
    with slab.loan(1, *BYTE) as published:
        published.publish()  # a published loan is left as it is
    stats = slab.statistics()
    assert (stats.aborted, stats.held) == (2, 1)
    assert slab.slot(unpublished.ref.slot).state is SlotState.FREE
    assert slab.slot(published.ref.slot).state is SlotState.READY
    with pytest.raises(StaleSlot, match="publish of slot"):
        published.publish()  # a finished loan is refused by the C...
    with pytest.raises(StaleSlot, match="abort of slot"):
        published.abort()
    assert slab.slot(published.ref.slot).state is SlotState.READY  # ...and changes nothing


def test_sample_release_is_idempotent_and_a_with_block_releases(slab: Slab) -> None:
    with slab.loan(3, np.int32, (2, 2)) as loan:
        loan.array[:] = [[1, 2], [3, 4]]
        ref = loan.publish()
    with slab.receive(ref, np.int32, (2, 2)) as sample:
        assert sample.ref == ref and not sample.released
        assert sample.array.tolist() == [[1, 2], [3, 4]] and not sample.array.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            sample.array[0, 0] = 9
    assert sample.released and slab.held(3) == 0
    sample.release()  # later calls do nothing
    with pytest.raises(StaleSlot):
        slab.receive(ref, np.int32, (2, 2))  # the generation moved on
    ref = slab.loan(3, *BYTE).publish()
    sample = slab.receive(ref, *BYTE)
    sample.release()
    sample.release()
    stats = slab.statistics()
    assert (stats.released, stats.stale_refused, stats.held) == (2, 0, 0)


def test_dead_owner_slots_are_reclaimed_in_one_call(slab: Slab) -> None:
    refs = [slab.loan(3, *BYTE).publish() for _ in range(2)]
    mine = slab.loan(4, *BYTE)
    parent, child = SPAWN.Pipe()
    holder = SPAWN.Process(
        target=shm_workers.hold_slots, args=(slab.segment.name, slab.offset, refs, child)
    )
    holder.start()
    assert parent.poll(30) and parent.recv() == 2
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    assert slab.reclaim(3) == 2
    assert slab.held(3) == 0 and slab.held(4) == 1
    assert slab.slot(mine.ref.slot).state is SlotState.WRITING  # others untouched
    for ref in refs:
        with pytest.raises(StaleSlot):
            slab.release(ref)
    doomed = slab.loan(5, *BYTE)
    assert slab.reclaim(5) == 1
    with pytest.raises(StaleSlot, match="is free at generation"):
        doomed.publish()  # a reclaimed loan cannot be published either
    with slab.loan(5, *BYTE) as doomed:
        slab.reclaim(5)
    assert slab.held(5) == 0  # leaving the block: nothing left to abort, and no error
    assert slab.statistics().reclaimed == 4
    with pytest.raises(ValueError, match="past the slab's"):
        slab.reclaim(99)


def test_pin_is_a_noop_without_torch_and_never_imports_it(slab: Slab) -> None:
    code = (
        "import sys\n"
        "from shm import Segment, Slab\n"
        f"seg = Segment.open({slab.segment.name!r})\n"
        f"print(Slab(seg, {slab.offset}).pin(), 'torch' in sys.modules)\n"
    )
    done = python_c(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_statistics_and_slot_info_come_by_name_from_the_c_structs(slab: Slab) -> None:
    loan = slab.loan(6, *BYTE)
    info = slab.slot(loan.ref.slot)
    assert (info.state, info.generation, info.owner) == (SlotState.WRITING, 0, 6)
    assert info.since_ns > 0
    stats = slab.statistics()
    assert (stats.slots, stats.max_owners, stats.quota) == (4, 8, 3)
    assert stats.slot_size == slab.slot_size == 4 * 256 * 256
    assert (stats.acquired, stats.held, stats.high_water) == (1, 1, 1)
    with pytest.raises(SegmentError, match="nothing is laid out there"):
        Slab(slab.segment, slab.data_offset)
