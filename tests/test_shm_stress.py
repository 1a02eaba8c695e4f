"""Rings across real processes: ordering and integrity under every wait policy, no
lost wake-ups, and a producer killed mid-stream."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from typing import Any

import pytest
import shm_workers
from ring_rigs import join

from shm import Doorbell, Ring, Segment, shm_name
from shm.segment import HEADER_SIZE

SPAWN = multiprocessing.get_context("spawn")
CAPACITY = 4096


class TwoRings:
    """Two rings in one segment, each with its doorbell."""

    def __init__(self, prefix: str, policy: str) -> None:
        self.policy = policy
        size = HEADER_SIZE + 2 * Ring.footprint(CAPACITY)
        self.segment = Segment.create(shm_name(prefix, "rings"), size)
        self.offsets = (HEADER_SIZE, HEADER_SIZE + Ring.footprint(CAPACITY))
        self.bells = (shm_name(prefix, "bell0"), shm_name(prefix, "bell1"))
        self.doorbells = [Doorbell(b, create=True) for b in self.bells]
        self.rings = [
            Ring.create(self.segment, off, CAPACITY, doorbell=bell, policy=policy)
            for off, bell in zip(self.offsets, self.doorbells, strict=True)
        ]

    def worker(self, target: Callable[..., None], *args: Any) -> BaseProcess:
        """``target(the segment's name, the first ring's offset, *args)``, started
        in a spawned process."""
        process = SPAWN.Process(target=target, args=(self.segment.name, self.offsets[0], *args))
        process.start()
        return process

    def close(self) -> None:
        self.segment.close()
        self.segment.unlink()
        for bell in self.doorbells:
            bell.close()
            bell.unlink()


@pytest.fixture
def rings(shm_prefix: str, request: pytest.FixtureRequest) -> Iterator[TwoRings]:
    r = TwoRings(shm_prefix, getattr(request, "param", "spin-then-block"))
    yield r
    r.close()


def _stream(rings: TwoRings, count: int) -> None:
    max_payload = rings.rings[0].max_record
    producer = rings.worker(
        shm_workers.produce, rings.bells[0], rings.policy, count, max_payload, True
    )
    expected = 0
    deadline = time.monotonic() + 120
    while expected < count:
        assert time.monotonic() < deadline, f"stalled at record {expected} of {count}"
        for record in rings.rings[0].pop_batch(timeout=30):
            assert shm_workers.check_record(record, max_payload) == expected
            expected += 1
    join(producer, "worker process")
    stats = rings.rings[0].statistics()
    assert stats.pushed == stats.popped == count
    assert stats.bytes_pushed == stats.bytes_popped
    assert stats.high_water_bytes <= CAPACITY
    assert stats.bytes_pushed > 20 * CAPACITY  # many wraps


@pytest.mark.parametrize("rings", ["spin", "spin-then-block", "block"], indirect=True)
def test_stream_keeps_order_and_integrity_under_each_wait_policy(rings: TwoRings) -> None:
    _stream(rings, 20_000)


@pytest.mark.soak
@pytest.mark.timeout(900)
@pytest.mark.parametrize("rings", ["spin", "spin-then-block", "block"], indirect=True)
def test_soak_stream(rings: TwoRings) -> None:
    _stream(rings, 300_000)


@pytest.mark.parametrize("rings", ["block", "spin-then-block"], indirect=True)
def test_no_lost_wakeups_in_a_ping_pong(rings: TwoRings) -> None:
    """Every round trip needs a wake-up on each side; the waits have no liveness
    slices, so a single lost wake-up would stall a pop for its full 30 s."""
    count = 3000
    echo = rings.worker(shm_workers.echo, rings.offsets[1], rings.bells, rings.policy, count)
    ping, pong = rings.rings
    for i in range(count):
        if i % 50 == 0:
            time.sleep(0.001)  # longer than any spin: the echo side must go to sleep
        ping.push(i.to_bytes(8, "little"), timeout=30)
        assert int.from_bytes(pong.pop(timeout=30), "little") == i
    join(echo, "worker process")
    assert ping.statistics().wakeups > 0  # the doorbell really was used


def test_producer_killed_mid_stream_leaves_only_whole_records(rings: TwoRings) -> None:
    ring = rings.rings[0]
    producer = rings.worker(shm_workers.produce_until_killed, ring.max_record)
    expected = 0
    deadline = time.monotonic() + 60
    while expected < 3000:
        assert time.monotonic() < deadline
        for record in ring.pop_batch_nowait():
            assert shm_workers.check_record(record, ring.max_record) == expected
            expected += 1
    assert producer.pid is not None
    os.kill(producer.pid, signal.SIGKILL)
    producer.join(10)
    for record in ring.pop_batch_nowait():  # whatever it published before dying
        assert shm_workers.check_record(record, ring.max_record) == expected
        expected += 1
    assert ring.pop_batch_nowait() == []
    ring.reset()
    ring.push_nowait(b"a new producer")
    assert ring.pop_nowait() == b"a new producer"
