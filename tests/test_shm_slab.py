"""Slab: zero-copy handoff across processes, generations, quotas, dead-owner reclaim."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import shm_workers

from shm import ForeignSlot, QuotaExceeded, Segment, Slab, SlabFull, SlotState, StaleSlot, shm_name
from shm.segment import HEADER_SIZE

SPAWN = multiprocessing.get_context("spawn")
SHAPE = (256, 256)  # 256 KiB of float32


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
    lease = slab.acquire(owner=2)
    data = slab.writable(lease, np.float32, SHAPE)
    data[:] = 1.5
    slab.publish(lease)
    parent, child = SPAWN.Pipe()
    reader = SPAWN.Process(
        target=shm_workers.read_slot,
        args=(slab.segment.name, slab.offset, lease.slot, lease.generation, 2, child),
    )
    reader.start()
    assert parent.poll(30)
    seen = parent.recv()
    low, high = seen["segment"]
    assert low <= seen["address"] < high  # the reader's array lies inside its slab mapping
    assert seen["address"] - low == slab.data_offset + lease.slot * slab.slot_size
    assert seen["readonly"] and seen["first"] == 1.5
    data[0, 0] = 42.0  # written after the reader took its view...
    parent.send("look again")
    assert parent.poll(30)
    assert parent.recv() == 42.0  # ...and seen through that same view: no copy was made
    parent.send("release")
    assert parent.poll(30)
    assert parent.recv() == "StaleSlot"  # its second release of the same generation
    reader.join(30)
    assert reader.exitcode == 0
    info = slab.slot(lease.slot)
    assert info.state is SlotState.FREE and info.generation == lease.generation + 1
    stats = slab.statistics()
    assert (stats.acquired, stats.released, stats.stale_refused, stats.held) == (1, 1, 1, 0)


def test_stale_generation_and_foreign_owner_releases_are_refused(slab: Slab) -> None:
    first = slab.acquire(owner=1)
    slab.publish(first)
    slab.release(first.slot, first.generation, 1)
    again = slab.acquire(owner=1)  # maybe the same slot, at a newer generation
    slab.publish(again)
    with pytest.raises(StaleSlot):
        slab.release(first.slot, first.generation, 1)
    with pytest.raises(ForeignSlot):
        slab.release(again.slot, again.generation, 5)
    with pytest.raises(StaleSlot):
        slab.view(again.slot, again.generation + 1, np.uint8, (4,))
    with pytest.raises(StaleSlot, match="does not exist"):
        slab.view(99, 0, np.uint8, (4,))
    assert slab.slot(again.slot).state is SlotState.READY  # nothing refused changed anything
    with pytest.raises(ValueError, match="exceed a slot"):
        slab.view(again.slot, again.generation, np.float64, SHAPE)


def test_quota_stalls_only_its_owner_and_full_is_typed(slab: Slab) -> None:
    held = [slab.acquire(owner=0) for _ in range(3)]
    with pytest.raises(QuotaExceeded, match="quota of 3"):
        slab.acquire(owner=0)
    other = slab.acquire(owner=1)  # another owner is not held back
    with pytest.raises(SlabFull):
        slab.acquire(owner=2)
    slab.abort(other)
    slab.acquire(owner=2)
    stats = slab.statistics()
    assert (stats.quota_refused, stats.full_events, stats.aborted, stats.held) == (1, 1, 1, 4)
    assert slab.held(0) == 3 and len(held) == 3


def test_dead_owner_slots_are_reclaimed_in_one_call(slab: Slab) -> None:
    leases = [slab.acquire(owner=3) for _ in range(2)]
    for lease in leases:
        slab.publish(lease)
    mine = slab.acquire(owner=4)
    parent, child = SPAWN.Pipe()
    holder = SPAWN.Process(
        target=shm_workers.hold_slots,
        args=(slab.segment.name, slab.offset, [(x.slot, x.generation) for x in leases], child),
    )
    holder.start()
    assert parent.poll(30) and parent.recv() == 2
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    assert slab.reclaim(3) == 2
    assert slab.held(3) == 0 and slab.held(4) == 1
    assert slab.slot(mine.slot).state is SlotState.WRITING  # others untouched
    for lease in leases:
        with pytest.raises(StaleSlot):
            slab.release(lease.slot, lease.generation, 3)
    with pytest.raises(StaleSlot):
        slab.publish(leases[0])  # a reclaimed lease cannot be published either
    assert slab.statistics().reclaimed == 2


def test_pin_is_a_noop_without_torch_and_never_imports_it(slab: Slab) -> None:
    code = (
        "import sys\n"
        "from shm import Segment, Slab\n"
        f"seg = Segment.open({slab.segment.name!r})\n"
        f"print(Slab(seg, {slab.offset}).pin(), 'torch' in sys.modules)\n"
    )
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]
