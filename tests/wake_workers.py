"""Child-process bodies for tests/test_wakeups.py (importable, so spawn works)."""

from __future__ import annotations

import time

from shm import Doorbell, Ring, Segment


def push_when_asleep(seg_name: str, offset: int, bell: str, count: int) -> None:
    """``count`` times: wait until the ring's consumer has announced its sleep, then
    push one record (so each push is a post that ends a sleep)."""
    segment = Segment.open(seg_name)
    doorbell = Doorbell(bell)
    ring = Ring(segment, offset, doorbell=doorbell)
    try:
        for i in range(count):
            deadline = time.monotonic() + 30
            while not ring.statistics().consumer_sleeping:
                assert time.monotonic() < deadline, "the consumer never slept"
                time.sleep(0.001)
            ring.push_nowait(bytes([i]))
    finally:
        doorbell.close()
        segment.close()
