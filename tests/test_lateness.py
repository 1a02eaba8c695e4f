"""rte.lateness: the margin a paced wait wakes early by, learned from how late
things came; the Pacer's naps and a client's tick waits use it."""

from __future__ import annotations

import time

import pytest
from ring_rigs import OneRing

from rte.client.ticks import TICK_CAP_NS, TICK_SPIN_NS, TickWait
from rte.lateness import Lateness
from rte.realtime import SPIN_CAP_NS, Pacer

MS = 1_000_000


def test_the_margin_is_its_floor_until_something_comes_late() -> None:
    late = Lateness(300_000, 3 * MS)
    assert late.margin_ns() == 300_000
    for _ in range(50):
        late.saw(-50_000)  # early: nothing to learn
        late.saw(20_000)  # well within the floor
    assert late.margin_ns() == 300_000


def test_late_samples_widen_it_at_once_and_it_comes_back_slowly() -> None:
    late = Lateness(300_000, 3 * MS)
    for _ in range(4):
        late.saw(MS)  # four naps that woke a millisecond late
    assert 1.5 * MS <= late.margin_ns() <= 2 * MS  # twice the ~90th percentile
    widest = late.margin_ns()
    late.saw(0)
    assert widest * 0.8 < late.margin_ns() < widest  # one on-time sample: a little
    for _ in range(200):
        late.saw(0)
    assert late.margin_ns() == 300_000  # a quiet box: back to the floor


def test_it_keeps_the_tail_not_the_mean() -> None:
    """One sample in ten a millisecond late, the rest on time: the margin covers
    the late ones (a mean would say 0.1 ms)."""
    late = Lateness(0, 3 * MS)
    for k in range(400):
        late.saw(MS if k % 10 == 0 else 0)
    assert late.margin_ns() >= 0.5 * MS


def test_it_never_passes_its_cap_and_one_stall_never_sticks() -> None:
    late = Lateness(300_000, 3 * MS)
    late.saw(10**12)  # a process stopped for a quarter of an hour
    assert late.margin_ns() == 3 * MS
    for _ in range(120):
        late.saw(0)
    assert late.margin_ns() == 300_000
    with pytest.raises(ValueError):
        Lateness(2 * MS, MS)


def test_a_pacer_whose_naps_wake_late_wakes_earlier() -> None:
    """Each nap sleeps what it was asked plus 1 ms (a busy box's wait for a core):
    the pacer learns it, asks for shorter naps and still starts each turn at its
    tick, never before; its margin stays within the cap."""
    pacer = Pacer(200.0)  # 5 ms a tick
    asked: list[float] = []

    def late_sleep(seconds: float) -> bool:
        asked.append(seconds)
        time.sleep(seconds + 0.001)
        return False

    early = []
    for _ in range(12):
        pacer.begin()
        pacer.wait(late_sleep)
        early.append(pacer.tick - time.monotonic())
    assert pacer.wake.margin_ns() >= 1.5 * MS  # it learned the extra millisecond
    assert pacer.wake.margin_ns() <= SPIN_CAP_NS
    assert asked[-1] < asked[0] - 0.001  # so its naps end earlier
    assert all(e <= 0 for e in early)  # and no turn began before its tick


def test_a_client_that_saw_records_land_late_spins_longer_past_the_tick(
    shm_prefix: str,
) -> None:
    """Records that landed 2 ms after their tick (a daemon late on a busy box) widen
    how long the client spins past the next tick before it sleeps (where a post
    would have to wake it), up to the cap; a wait that gets nothing still ends
    at its timeout, saying so."""
    rig = OneRing(shm_prefix)
    try:
        ticks = TickWait()
        assert ticks.landed.margin_ns() == TICK_SPIN_NS
        for _ in range(4):
            rig.ring.push_nowait(b"step" * 2)  # (there: it landed 2 ms past its tick)
            assert ticks.wait(rig.ring, lambda: None, time.monotonic_ns() - 2 * MS, 1.0)
            rig.ring.pop_batch_nowait()
        assert ticks.landed.margin_ns() == TICK_CAP_NS
        assert not ticks.wait(rig.ring, lambda: None, time.monotonic_ns() + 2 * MS, 0.01)
    finally:
        rig.close()


def test_a_client_that_gets_nothing_at_its_ticks_stops_spinning_for_them(
    shm_prefix: str,
) -> None:
    """No credit left, nothing comes: after two ticks whose whole window caught
    nothing the wait sleeps until a record comes (spinning every tick took 12 to
    13 % of a core in CI); the first record that comes brings the spin back."""
    rig = OneRing(shm_prefix)
    try:
        ticks = TickWait()
        for _ in range(2):
            assert not ticks.wait(rig.ring, lambda: None, time.monotonic_ns() - 5 * MS, 0.01)
        assert ticks.idle == 2
        rig.ring.push_nowait(b"step" * 2)
        assert ticks.wait(rig.ring, lambda: None, time.monotonic_ns(), 1.0)
        assert ticks.idle == 0
    finally:
        rig.close()


def test_a_client_wakes_before_its_tick_by_how_late_its_naps_come_not_twice() -> None:
    """Naps that woke a millisecond late make the client wake about a millisecond
    before the tick, not two: the record lands after the tick, which covers a
    wake later still, and at 60 Hz the doubled lead spun 13-14 % of a core for
    the same latency (9-10 % now: ``python -m tools.bench_e2e --modes paced``)."""
    ticks = TickWait()
    for _ in range(8):
        ticks.woke.saw(MS)
    assert 0.8 * MS <= ticks.woke.margin_ns() <= 1.1 * MS
    with pytest.raises(ValueError, match="positive multiple"):
        Lateness(0, MS, times=0)
