"""Random clients against one daemon, round after round: the daemon lives, a
bystander streams on without a gap, and everything returns to its baseline.

Each round starts a few client processes doing random things (valid and invalid
requests, held and released chunks, closes and reconnects); some are killed
mid-way, some stopped and continued. After each round, with the round's clients
gone, the daemon must hold exactly what it held before: client slots, rows,
slab slots, /dev/shm objects, file descriptors, and memory within a margin.
A short form runs by default; ``pytest -m soak`` runs the long one.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections.abc import Iterator

import daemon_workers
import psutil
import pytest
from daemon_harness import DaemonProcess, leftovers, wait_for

from rte.ipc.claims import ClientState
from rte.ipc.control import Control
from rte.ipc.names import DaemonNames
from shm import Segment, Slab
from shm.segment import HEADER_SIZE

SPAWN = multiprocessing.get_context("spawn")
ROUND_S = 1.0


class Watch:
    """Read-only views of the daemon's table and slab, for the baseline checks."""

    def __init__(self, name: str) -> None:
        names = DaemonNames(name)
        self.control_segment = Segment.open(names.control, readonly=True)
        self.control = Control(self.control_segment)
        self.slab_segment = Segment.open(names.slab, readonly=True)
        self.slab = Slab(self.slab_segment, HEADER_SIZE)

    def state(self) -> tuple[list[tuple[int, ClientState, int]], int]:
        clients = [(c.index, c.state, c.sessions) for c in self.control.table.entries()]
        return [c for c in clients if c[1] is not ClientState.FREE], self.slab.statistics().held

    def close(self) -> None:
        self.slab_segment.close()
        self.control_segment.close()


class Bystander:
    """One session streamed throughout; every chunk index is kept."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.client = daemon.client()
        self.client.attach("steady")
        self.seen: list[int] = []

    def drain(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            chunk = self.client.poll(timeout=0.02)
            if chunk is not None:
                with chunk:
                    self.seen.append(chunk.chunk)


@pytest.fixture
def arena(shm_prefix: str) -> Iterator[tuple[DaemonProcess, Bystander, Watch]]:
    d = DaemonProcess(
        shm_prefix,
        *("--max-sessions", "10", "--max-clients", "6", "--slab-slots", "24"),
        *("--ring-kib", "16", "--idle-limit-s", "1.5"),
    )
    bystander = Bystander(d)
    watch = Watch(d.name)
    yield d, bystander, watch
    watch.close()
    bystander.client.close()
    assert d.stop() == 0, d.stderr
    assert leftovers(shm_prefix) == []


def _round(daemon: DaemonProcess, bystander: Bystander, rng: random.Random, number: int) -> None:
    workers = [
        SPAWN.Process(
            target=daemon_workers.chaos, args=(daemon.name, number * 10 + k, ROUND_S), daemon=True
        )
        for k in range(rng.randint(2, 4))
    ]
    for worker in workers:
        worker.start()
    bystander.drain(ROUND_S * rng.uniform(0.3, 0.7))
    for worker in workers:  # faults of every kind, at random moments
        assert worker.pid is not None
        fate = rng.random()
        if fate < 0.3:
            os.kill(worker.pid, signal.SIGKILL)
        elif fate < 0.5:
            os.kill(worker.pid, signal.SIGSTOP)
            bystander.drain(0.2)
            os.kill(worker.pid, signal.SIGCONT)
    end = time.monotonic() + ROUND_S + 10
    while any(w.is_alive() for w in workers) and time.monotonic() < end:
        bystander.drain(0.05)
    for worker in workers:
        if worker.is_alive():
            worker.kill()
        worker.join(10)


def _run(arena: tuple[DaemonProcess, Bystander, Watch], rounds: int) -> None:
    daemon, bystander, watch = arena
    bystander.drain(0.3)
    baseline = watch.state()
    process = psutil.Process(daemon.pid)
    fds, rss = process.num_fds(), process.memory_info().rss
    objects = leftovers(daemon.name)
    rng = random.Random(20261129)
    for number in range(rounds):
        _round(daemon, bystander, rng, number)
        assert daemon.process.poll() is None, daemon.said()

        def settled() -> bool:
            bystander.drain(0.05)
            table, held = watch.state()
            return table == baseline[0] and held <= watch.slab.quota  # the bystander's alone

        wait_for(settled, timeout=20, what=f"round {number}: the table back to {baseline}")
        assert process.num_fds() <= fds + 2, f"round {number}: file descriptors leak"
        assert leftovers(daemon.name) == objects
        grown = process.memory_info().rss - rss
        assert grown < 64 << 20, f"round {number}: the daemon grew {grown / 2**20:.0f} MiB"
    seen = bystander.seen
    assert seen == list(range(seen[0], seen[0] + len(seen))), "the bystander saw a gap"
    assert len(seen) > 10 * rounds
    counters = watch.control.counters()  # the rounds really did something
    assert counters["requests"] > 20 * rounds and counters["errors"] > 0, counters
    assert counters["dead_clients_reaped"] > 0, counters


@pytest.mark.timeout(300)
def test_random_clients_never_hurt_the_daemon_or_a_bystander(
    arena: tuple[DaemonProcess, Bystander, Watch],
) -> None:
    _run(arena, rounds=5)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_random_clients_soak(arena: tuple[DaemonProcess, Bystander, Watch]) -> None:
    _run(arena, rounds=200)
