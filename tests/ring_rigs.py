"""What the ring tests across processes and in one share (tests/test_shm_ring.py,
test_wakeups.py, test_shm_stress.py): a ring in a segment of its own with its
doorbell, and the join of a worker process that must end well."""

from __future__ import annotations

import multiprocessing.process

import pytest

from shm import Doorbell, Ring, Segment, shm_name
from shm.segment import HEADER_SIZE


class OneRing:
    """A ring of ``capacity`` bytes in a segment of its own, with its doorbell (both
    unlinked at close); the names let another process open them."""

    def __init__(self, prefix: str, capacity: int = 256) -> None:
        self.segment_name, self.bell_name = shm_name(prefix, "ring"), shm_name(prefix, "bell")
        self.segment = Segment.create(self.segment_name, HEADER_SIZE + Ring.footprint(capacity))
        self.bell = Doorbell(self.bell_name, create=True)
        self.ring = Ring.create(self.segment, HEADER_SIZE, capacity, doorbell=self.bell)

    def close(self) -> None:
        self.segment.close()
        self.segment.unlink()
        self.bell.close()
        self.bell.unlink()


def join(process: multiprocessing.process.BaseProcess, what: str) -> None:
    """Wait for ``process`` (60 s at most: then it is killed and the test fails,
    saying ``what`` did not finish); it must have exited 0."""
    process.join(60)
    if process.is_alive():
        process.kill()
        process.join(5)
        pytest.fail(f"{what} did not finish")
    assert process.exitcode == 0
