"""Waiting without paying for a wake-up, and showing it (issue 27).

A post that wakes a sleeping process is the dearest thing on the path, so every
wait is counted (:class:`~shm.waiting.WaitTally`), the spin before a sleep
follows how long records recently took (:class:`~shm.waiting.AdaptiveSpin`),
and ``rte inspect`` shows each side's sleeps and wake-ups per step. Behaviour
only: counts exist and rise when a side sleeps; never how fast anything is.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
import wake_workers
from daemon_harness import DaemonProcess, wait_for
from ring_rigs import OneRing, join
from test_inspector import run as inspect

from rte.ipc.inspect import waking
from shm import WaitPolicy, wait_any
from shm.native import lib
from shm.segment import HEADER_SIZE
from shm.waiting import AdaptiveSpin, WaitTally

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def one_ring(shm_prefix: str) -> Iterator[OneRing]:
    rig = OneRing(shm_prefix)
    yield rig
    rig.close()


def pusher(rig: OneRing, count: int) -> multiprocessing.process.BaseProcess:
    """A producer process that pushes ``count`` records, each once we sleep."""
    process = SPAWN.Process(
        target=wake_workers.push_when_asleep,
        args=(rig.segment_name, HEADER_SIZE, rig.bell_name, count),
    )
    process.start()
    return process


def test_the_spin_follows_recent_waits_within_its_bounds() -> None:
    spin = AdaptiveSpin(floor_ns=50_000, max_ns=1_000_000)
    assert spin.budget_ns() == 50_000  # nothing seen yet: no more than the floor
    for _ in range(20):  # records come 200 µs after a wait begins
        spin.observe(200_000, ended=True)
    assert 350_000 <= spin.budget_ns() <= 450_000  # about twice that
    for _ in range(20):  # ... then 10 µs
        spin.observe(10_000, ended=True)
    assert spin.budget_ns() == 50_000  # never under the floor
    for _ in range(20):  # ... then 600 µs: twice would pass the cap
        spin.observe(600_000, ended=True)
    assert spin.budget_ns() == 1_000_000
    for _ in range(20):  # ... then the peer went idle: a spin would catch nothing
        spin.observe(50_000_000, ended=False)
    assert spin.budget_ns() == 50_000


def test_a_wait_that_slept_learns_when_its_record_was_pushed_not_when_it_woke(
    one_ring: OneRing,
) -> None:
    """The spin learns how long a record took to come from the ring's push stamp.
    Here the record is pushed about 5 ms into the wait and its post is held back,
    so the sleeper wakes only at its 0.5 s timeout. Learning 0.5 s (as it did,
    from when the waiter woke) is how a flat-out pair fell into sleeping on every
    record: each wake-up made the waits look longer than the spin could cover,
    the spin fell to its floor, and the next wait slept too."""
    ring = one_ring.ring
    before = ring.spin.typical_ns
    began = time.monotonic_ns()
    late = threading.Timer(0.005, lambda: lib.shm_ring_push(ring.handle, b"record", 6, 0))
    late.start()  # pushed by the C alone: no post, so the sleeper is not woken for it
    try:
        assert ring.wait_readable(0.5, policy=WaitPolicy.SPIN_THEN_BLOCK)
    finally:
        late.join(5)
    assert time.monotonic_ns() - began >= 400_000_000  # it did sleep to its timeout
    assert ring.tally.sleeps == 1
    came = (ring.spin.typical_ns - before) * 4 + before  # the one sample it learned
    assert 4_000_000 <= came <= 100_000_000, f"learned {came / 1e6:.1f} ms"


def test_tally_taken_hands_over_the_counts_and_starts_again() -> None:
    tally = WaitTally(waits=3, sleeps=2, wakeups=1)
    assert tally.taken() == WaitTally(3, 2, 1)
    assert tally == WaitTally()


def test_a_sleep_that_a_post_ends_is_a_wakeup_on_both_sides(one_ring: OneRing) -> None:
    ring, tally = one_ring.ring, WaitTally()
    ring.push_nowait(b"already there")
    assert wait_any([ring], one_ring.bell, 1.0, policy=WaitPolicy.BLOCK, tally=tally)
    assert tally == WaitTally()  # a record waiting: not a wait at all
    ring.pop_nowait()
    assert not wait_any([ring], one_ring.bell, 0.01, policy=WaitPolicy.BLOCK, tally=tally)
    assert tally == WaitTally(waits=1, sleeps=1, wakeups=0)  # slept, nobody posted
    producer = pusher(one_ring, 1)
    try:
        assert wait_any([ring], one_ring.bell, 30.0, policy=WaitPolicy.BLOCK, tally=tally)
    finally:
        join(producer, "the producer")
    assert tally == WaitTally(waits=2, sleeps=2, wakeups=1)
    assert ring.statistics().wakeups == 1  # the producer's post, counted in the header


def test_a_rings_own_waits_are_counted_in_its_tally(one_ring: OneRing) -> None:
    ring = one_ring.ring
    producer = pusher(one_ring, 3)
    try:
        for _ in range(3):
            assert ring.wait_readable(30.0, policy=WaitPolicy.BLOCK)
            ring.pop_nowait()
    finally:
        join(producer, "the producer")
    assert ring.tally.waits == ring.tally.sleeps == 3
    assert ring.tally.wakeups == ring.statistics().wakeups == 3


def test_inspect_shows_each_sides_sleeps_and_wakeups_per_step(shm_prefix: str) -> None:
    """A client that pauses between chunks makes the daemon sleep on its doorbell
    and its release wake it: the daemon's counters say so, per step, in --json,
    the table and Prometheus; the client's outbox wake-ups are its own row."""
    d = DaemonProcess(shm_prefix, "--model", "null")
    try:
        with d.client() as client:
            client.attach("a", credits=1)
            for _ in range(5):  # each pause outlasts any spin: the daemon sleeps
                chunk = client.poll(timeout=10)
                assert chunk is not None
                time.sleep(0.1)
                chunk.release()

            def woke() -> bool:
                return json.loads(inspect(shm_prefix, "--json"))["counters"]["wakeups"] >= 3

            wait_for(woke)
            snap = json.loads(inspect(shm_prefix, "--json"))
            text = inspect(shm_prefix)
            metrics = inspect(shm_prefix, "--prometheus")
            index = client.index
    finally:
        assert d.stop() == 0
    counters = snap["counters"]
    assert counters["idle_waits"] >= counters["idle_sleeps"] >= counters["wakeups"] >= 3
    figures = snap["waking"]
    assert figures == waking(snap)
    assert figures["steps"] == counters["steps"] >= 5
    assert figures["daemon"]["wakeups_per_step"] == counters["wakeups"] / counters["steps"]
    (mine,) = figures["clients"]
    assert mine["index"] == index and mine["records"] >= 5
    assert mine["wakeups"] == snap["clients"][0]["rings"]["outbox"]["wakeups"]
    assert "waking (per step" in text and "WAKES" in text
    assert f'rte_wakeups_per_step{{daemon="{shm_prefix}",side="daemon"}}' in metrics
    assert "rte_daemon_wakeups_total" in metrics and "rte_client_ring_wakeups_total" in metrics
    recent = waking(snap, snap)  # nothing happened since itself
    assert recent["steps"] == 0 and recent["daemon"]["wakeups_per_step"] is None


def test_a_daemon_without_sessions_sleeps_instead_of_spinning(shm_prefix: str) -> None:
    """Idle with a client but no session, under the default spin-then-block policy,
    every wait of the daemon sleeps, and its process uses next to no CPU."""
    d = DaemonProcess(shm_prefix, "--model", "null", "--wait-policy", "spin-then-block")
    try:
        with d.client():
            before = json.loads(inspect(shm_prefix, "--json"))["counters"]
            process = psutil.Process(d.pid)
            cpu = process.cpu_times()
            time.sleep(1.0)
            after_cpu = process.cpu_times()
            after = json.loads(inspect(shm_prefix, "--json"))["counters"]
    finally:
        assert d.stop() == 0
    used = (after_cpu.user + after_cpu.system) - (cpu.user + cpu.system)
    assert used < 0.2, f"an idle daemon used {used:.2f} s of CPU in 1 s: it spins"
    waits = after["idle_waits"] - before["idle_waits"]
    sleeps = after["idle_sleeps"] - before["idle_sleeps"]
    assert waits >= 5 and sleeps == waits  # each wait slept: none ended in a spin


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_give_back_that_credits_stamps_when_in_the_credit_block(
    shm_prefix: str, path: str
) -> None:
    """Each release that credits writes the clock in the client's credit block (the
    C give back in its one call; the reference path after its credits): what a
    daemon waiting for those credits learns from (below)."""
    daemon = DaemonProcess(shm_prefix, "--model", "null", "--max-sessions", "1")
    try:
        with daemon.client() as client:
            transport = client.transport
            transport.judging = path == "c"  # (False: the Python reference reads the STEPs)
            block = transport.slot.mailbox.block  # (its credit block, as the daemon maps it)
            assert block.given_ns() == 0  # never credited yet
            client.attach("s")
            batch = client.poll_batch(timeout=30)
            assert batch is not None
            before = time.monotonic_ns()
            batch.release()
            assert before <= block.given_ns() <= time.monotonic_ns()
    finally:
        assert daemon.stop() == 0, daemon.stderr


def test_an_idle_wait_learns_when_its_credits_or_requests_came_not_when_it_woke(
    shm_prefix: str,
) -> None:
    """The daemon's idle wait learned its own length, wake-up included (~145 µs
    here, for a sleep): the bistable trap the client's wait fell into. Now it learns
    from the newest stamp after it began (a client's give back, or a request's
    push), and its own length only without one."""
    from types import SimpleNamespace  # noqa: PLC0415

    from rte.ipc.core import _came  # noqa: PLC0415
    from rte.protocol.mailbox import Mailbox  # noqa: PLC0415
    from shm import Segment  # noqa: PLC0415

    segment = Segment.create(f"{shm_prefix}mb", Mailbox.size(4096, 4))
    try:
        mailbox = Mailbox.create(segment, 4096, 4)
        client = SimpleNamespace(block=mailbox.block, inbox=mailbox.inbox)  # (a Connection's)
        began = time.monotonic_ns()
        time.sleep(0.005)
        mailbox.block.credited()  # credits given back 5 ms into the wait
        time.sleep(0.2)  # ... and the waiter woke 200 ms later
        assert 4_000_000 <= _came(began, [client]) <= 100_000_000
        began = time.monotonic_ns()
        time.sleep(0.005)
        mailbox.inbox.push_nowait(b"a request")  # a request, 5 ms in
        time.sleep(0.2)
        assert 4_000_000 <= _came(began, [client]) <= 100_000_000
        began = time.monotonic_ns()  # nothing stamped after it: the wait's own length
        time.sleep(0.05)
        assert _came(began, [client]) >= 50_000_000
    finally:
        segment.close()
        segment.unlink()
