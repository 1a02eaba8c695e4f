"""Random clients against real daemons, round after round: the daemons live, a
bystander streams on without a gap, and everything returns to its baseline.

Each round starts a few client processes doing random things, valid and
invalid (tests/daemon_workers.py's plain client; tests/chaos_actors.py's loans
and frames by value, asyncio clients, pools): some are killed mid-way, some
stopped and continued. Three arenas: one daemon; a pool over two daemons, one
of which is SIGKILLed mid-round and started again; ``rte serve --replicas 2``
with a child SIGKILLed (the supervisor restarts it). After each round, with the
round's clients gone, every surviving daemon holds exactly what it held before
(client slots and their rows, slab slots, input slots, the objects in /dev/shm
FIFOs included, the daemon's file descriptors, its memory within a margin), a
restarted one exactly what it held when new, and the bystander (a steady
client in its own process) saw every chunk of its sessions, each its own.

The randomness is seeded: a failure says the seed and round, and
``RTE_CHAOS_SEED=S RTE_CHAOS_ROUND=N`` replays from that round. A short form
runs by default; ``pytest -m soak`` runs the long one.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import chaos_actors
import daemon_workers
import psutil
import pytest
from chaos_actors import tag_for
from daemon_harness import DaemonProcess, leftovers, wait_for
from test_supervisor import pid_of, until_ready

from rte.client import ShmClient
from rte.ipc.inspect import snapshot
from shm.names import objects, shm_name

SPAWN = multiprocessing.get_context("spawn")
ROUND_S = 1.0
SEED = int(os.environ.get("RTE_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
FIRST_ROUND = int(os.environ.get("RTE_CHAOS_ROUND") or 0)
STEADY = 10**9  # the bystander's sessions' owner numbers (see chaos_actors.tag_for)
SMALL_DAEMON = ("--max-clients", "6", "--ring-kib", "16")
SMALL_DAEMON += ("--idle-limit-s", "1.5")


def rounds(count: int) -> Iterator[tuple[int, random.Random]]:
    """Round numbers and each round's rng, from :data:`SEED`; a failure in a round
    says how to replay it."""
    print(f"chaos seed {SEED} (replay: RTE_CHAOS_SEED={SEED})")  # shown on any failure
    for number in range(FIRST_ROUND, FIRST_ROUND + count):
        yield number, random.Random(f"{SEED}:{number}")


@contextlib.contextmanager
def replaying(number: int) -> Iterator[None]:
    try:
        yield
    except BaseException as exc:
        exc.add_note(
            f"chaos round {number} of seed {SEED}: replay it with "
            f"RTE_CHAOS_SEED={SEED} RTE_CHAOS_ROUND={number}"
        )
        raise


def short_and_soak(short: dict[str, Any], long: dict[str, Any]) -> pytest.MarkDecorator:
    """A test in two forms, its ``form`` the arguments of each: ``short`` (run by
    default, 5 minutes at most) and ``long`` (``pytest -m soak`` runs it, an hour)."""
    return pytest.mark.parametrize(
        "form",
        [
            pytest.param(short, marks=pytest.mark.timeout(300), id="short"),
            pytest.param(long, marks=[pytest.mark.soak, pytest.mark.timeout(3600)], id="soak"),
        ],
    )


# -- what a daemon holds ----------------------------------------------------------


def holdings(name: str) -> tuple[list[tuple[int, str, int]], set[str], set[str]]:
    """Daemon ``name``'s client slots (index, state, rows), and the owners of its
    held slab slots and held input slots (read from its shared memory)."""
    seen = snapshot(name)
    table = sorted((c["index"], c["state"], c["sessions"]) for c in seen["clients"])
    slab = set((seen["slab"] or {}).get("held_by_client", {}))
    inputs = set((seen["inputs"] or {}).get("held_by_client", {}))
    return table, slab, inputs


@dataclass
class Baseline:
    """What a daemon holds with only the bystander attached, to come back to."""

    name: str
    pid: int
    table: list[tuple[int, str, int]] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)
    fds: int = 0
    rss: int = 0

    @classmethod
    def of(cls, name: str, pid: int) -> Baseline:
        process = psutil.Process(pid)
        table, _, _ = holdings(name)
        return cls(name, pid, table, leftovers(name), process.num_fds(), process.memory_info().rss)

    def settled(self) -> bool:
        table, slab, inputs = holdings(self.name)
        ours = {str(index) for index, _, _ in self.table}  # the bystander's slots only
        return table == self.table and slab <= ours and inputs <= ours

    def check(self, where: str) -> None:
        """Back to the baseline (waits for the dead clients to be reaped)."""
        wait_for(self.settled, timeout=20, what=f"{where}: {self.name} back to {self.table}")
        assert leftovers(self.name) == self.objects, f"{where}: /dev/shm objects of {self.name}"
        process = psutil.Process(self.pid)
        assert process.num_fds() <= self.fds + 2, f"{where}: {self.name} leaks descriptors"
        grown = process.memory_info().rss - self.rss
        assert grown < 64 << 20, f"{where}: {self.name} grew {grown / 2**20:.0f} MiB"


# -- the bystander and the round's workers ------------------------------------------


class Steady:
    """The bystander: tests/chaos_actors.py's ``bystander`` in a process of its own."""

    def __init__(self, name: str, *, null_model: bool) -> None:
        self.name = name
        self.conditioning = {  # a null model's chunks say whose they are
            f"steady-{k}": {"tag": tag_for(STEADY + k, 0)} if null_model else {"move": (1, 0)}
            for k in range(2)
        }
        self.conn, theirs = SPAWN.Pipe()
        self.process = SPAWN.Process(
            target=chaos_actors.bystander, args=(name, self.conditioning, theirs), daemon=True
        )
        self.process.start()
        assert self.conn.poll(60), "the bystander did not attach"
        self.index = self.conn.recv()
        self.chunks = dict.fromkeys(self.conditioning, 0)

    def report(self, command: str = "report") -> dict[str, Any]:
        assert self.process.is_alive(), f"the bystander died ({self.process.exitcode})"
        self.conn.send(command)
        assert self.conn.poll(30), "the bystander does not answer"
        report: dict[str, Any] = self.conn.recv()
        return report

    def check(self, where: str) -> None:
        """No gap, no notice, no error, no chunk of another's, and more chunks."""
        report = self.report()
        undisturbed = {k: report[k] for k in ("gaps", "wrong", "notices", "errors")}
        assert not any(undisturbed.values()), f"{where}: the bystander saw {undisturbed}"
        stalled = [s for s, n in report["chunks"].items() if n <= self.chunks[s]]
        assert not stalled, f"{where}: the bystander's {stalled} made no chunk ({report['chunks']})"
        self.chunks = report["chunks"]

    def stop(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(AssertionError, OSError, EOFError):
                self.report("stop")
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


@contextlib.contextmanager
def bystander(name: str, *, null_model: bool) -> Iterator[Steady]:
    """A :class:`Steady` of daemon ``name``, streaming for a moment before the
    block (the baseline is taken with it attached), stopped after it."""
    steady = Steady(name, null_model=null_model)
    try:
        time.sleep(0.3)
        yield steady
    finally:
        steady.stop()


def back_to_baseline(number: int, baseline: Baseline, steady: Steady) -> None:
    """After round ``number``: the daemon holds what it held before, and the
    bystander streamed on undisturbed."""
    baseline.check(f"round {number}")
    steady.check(f"round {number}")


def as_new(number: int, name: str, fresh: list[str]) -> None:
    """After round ``number``: daemon ``name``, killed and started again in it, holds
    no client and no more than ``fresh``, what it held when new."""
    wait_for(lambda: holdings(name)[0] == [], what=f"round {number}: {name} empty")
    assert leftovers(name) == fresh, f"round {number}: what {name} holds when new"


@dataclass
class Worker:
    kind: str
    args: tuple[Any, ...]
    process: Any = None
    fate: str = "ran"


def play(
    workers: list[Worker], rng: random.Random, middle: Callable[[random.Random], None] | None
) -> None:
    """Start ``workers``, fault them at random moments (at least one SIGKILLed),
    run ``middle`` meanwhile; then every worker not killed must end well."""
    targets = {
        "plain": daemon_workers.chaos,
        "inputs": chaos_actors.inputs_chaos,
        "async": chaos_actors.async_chaos,
        "pool": chaos_actors.pool_chaos,
    }
    started = []
    for worker in workers:
        ready = SPAWN.Event()
        body = (ready, targets[worker.kind], *worker.args)
        worker.process = SPAWN.Process(target=chaos_actors.run, args=body, daemon=True)
        worker.process.start()
        started.append(ready)
    for ready in started:
        assert ready.wait(60), "a worker did not start"
    fates = [rng.choice(["kill", "stop", "ran", "ran"]) for _ in workers]
    fates[rng.randrange(len(workers))] = "kill"
    time.sleep(ROUND_S * rng.uniform(0.3, 0.6))
    if middle is not None:
        middle(rng)
    for worker, fate in zip(workers, fates, strict=True):
        if fate == "kill":
            os.kill(worker.process.pid, signal.SIGKILL)
        elif fate == "stop":
            os.kill(worker.process.pid, signal.SIGSTOP)
            time.sleep(0.2)
            os.kill(worker.process.pid, signal.SIGCONT)
        worker.fate = fate
    for worker in workers:
        worker.process.join(ROUND_S + 15)
    hung = [w for w in workers if w.process.is_alive()]
    for worker in hung:
        worker.process.kill()
        worker.process.join(10)
    failed = [  # (a worker may have ended before its kill came)
        f"{w.kind}{w.args[1:]} ({w.fate}) exited with {w.process.exitcode}"
        for w in workers
        if w.process.exitcode not in ((0, -signal.SIGKILL) if w.fate == "kill" else (0,))
    ]
    assert not hung and not failed, f"workers hung {[w.kind for w in hung]} or failed {failed}"


# -- one daemon -------------------------------------------------------------------


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    d = DaemonProcess(shm_prefix, "--max-sessions", "10", *SMALL_DAEMON)
    yield d
    assert d.stop() == 0, d.stderr
    assert leftovers(shm_prefix) == []


def abuse_of(hostile: str | None, rng: random.Random) -> str | None:
    """The round's kind of abuse: ``hostile``, or for ``"any"`` one at random (or none)."""
    return rng.choice([None, *chaos_actors.HOSTILE]) if hostile == "any" else hostile


def run_one_daemon(daemon: DaemonProcess, count: int, hostile: str | None = None) -> None:
    """Plain, loaning and asyncio clients at random against one daemon
    (``hostile``: the loaning and asyncio ones abuse it so, see chaos_actors)."""
    with bystander(daemon.name, null_model=False) as steady:
        baseline = Baseline.of(daemon.name, daemon.pid)
        for number, rng in rounds(count):
            with replaying(number):
                abuse = abuse_of(hostile, rng)
                kinds = ["plain", "inputs", "async", rng.choice(["plain", "inputs", "async"])]
                workers = []
                for k, kind in enumerate(kinds[: rng.randint(3, 4)]):
                    seed = rng.randrange(1 << 32)
                    if kind == "plain":
                        args: tuple[Any, ...] = (daemon.name, seed // 10 * 10 + k, ROUND_S)
                    else:
                        args = (daemon.name, number * 10 + k, seed, ROUND_S, abuse)
                    workers.append(Worker(kind, args))
                play(workers, rng, None)
                assert daemon.process.poll() is None, daemon.said()
                back_to_baseline(number, baseline, steady)
        # a round's kill may land while its worker is between two clients (nothing to
        # reap: seen once in a CI run of one round), so one kill surely lands on a
        # client that streams
        kill_while_streaming(daemon.name)
        back_to_baseline(count, baseline, steady)
        counters = snapshot(daemon.name)["counters"]  # the rounds really did something
        assert counters["requests"] > 20 * count and counters["errors"] > 0, counters
        assert counters["dead_clients_reaped"] > 0, counters


def kill_while_streaming(name: str) -> None:
    """A client of daemon ``name`` SIGKILLed while it streams two sessions."""
    parent, child = SPAWN.Pipe()
    victim = SPAWN.Process(target=daemon_workers.stream_forever, args=(name, ["k0", "k1"], child))
    victim.start()
    try:
        assert parent.poll(30), "the client to kill did not attach"
        parent.recv()
    finally:
        victim.kill()
        victim.join(10)


@short_and_soak({"count": 3}, {"count": 200, "hostile": "any"})
def test_random_clients_never_hurt_the_daemon_or_a_bystander(
    daemon: DaemonProcess, form: dict[str, Any]
) -> None:
    run_one_daemon(daemon, **form)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hostile", chaos_actors.HOSTILE)
def test_hostile_clients_among_random_ones(daemon: DaemonProcess, hostile: str) -> None:
    """The same rounds with a kind of abuse mixed into the loaning and asyncio
    clients (issue 20 items 1, 2, 4): loans of impossible shapes, arguments of
    the wrong type or range, chunks read after their client closed. Each is
    refused with an rte error or does no harm; none crashes the client."""
    run_one_daemon(daemon, count=1, hostile=hostile)


# -- a pool over two daemons, one killed each round ---------------------------------


@dataclass
class Pair:
    """Two daemons for a pool: ``stays`` (with the bystander) and ``dies``."""

    prefix: str
    daemons: dict[str, DaemonProcess] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [f"{self.prefix}p-0", f"{self.prefix}p-1"]

    def kill_and_restart(self, rng: random.Random) -> None:
        """SIGKILL the daemon that dies; a moment later, start it again."""
        dies = self.names[1]
        self.daemons[dies].kill()
        time.sleep(rng.uniform(0.1, 0.4))
        self.start(dies)

    def start(self, name: str) -> DaemonProcess:
        d = DaemonProcess(name, "--model", "null", "--max-sessions", "8", *SMALL_DAEMON)
        self.daemons[name] = d
        d.client().close()  # up
        return d


@pytest.fixture
def pair(shm_prefix: str) -> Iterator[Pair]:
    pair = Pair(shm_prefix)
    try:
        for name in pair.names:
            pair.start(name)
        yield pair
    finally:
        codes = {}
        for name, d in pair.daemons.items():
            codes[name] = d.stop()
            codes[name] = 0 if codes[name] == 0 else (codes[name], d.stderr[-2000:])
        assert list(codes.values()) == [0, 0], codes
        assert objects(shm_name(shm_prefix)) == []


def run_pool(pair: Pair, count: int, hostile: str | None = None) -> None:
    stays, dies = pair.names
    with bystander(stays, null_model=True) as steady:
        baseline = Baseline.of(stays, pair.daemons[stays].pid)
        fresh = leftovers(dies)
        for number, rng in rounds(count):
            with replaying(number):
                workers = [  # pools, and a client of the daemon that dies alone
                    Worker("pool", (names, number * 10 + k, rng.randrange(1 << 32), ROUND_S))
                    for k, names in enumerate([pair.names, pair.names, [dies]])
                ]
                abuse = abuse_of(hostile, rng)
                for worker in workers:
                    worker.args += ("held-views" if abuse else None,)
                play(workers, rng, pair.kill_and_restart)
                assert pair.daemons[stays].process.poll() is None, pair.daemons[stays].said()
                back_to_baseline(number, baseline, steady)
                as_new(number, dies, fresh)


@short_and_soak({"count": 2}, {"count": 100, "hostile": "any"})
def test_a_pool_over_two_daemons_one_killed_each_round(pair: Pair, form: dict[str, Any]) -> None:
    run_pool(pair, **form)


@pytest.mark.timeout(300)
def test_a_pool_whose_clients_read_chunks_held_from_the_killed_daemon(pair: Pair) -> None:
    """Issue 20 item 1: a chunk held from a daemon the pool lost still reads."""
    run_pool(pair, count=1, hostile="held-views")


# -- a supervisor, one child killed each round --------------------------------------


@pytest.fixture
def supervisor(shm_prefix: str) -> Iterator[DaemonProcess]:
    name = f"{shm_prefix}s"
    d = DaemonProcess(name, "--replicas", "2", "--model", "null", "--max-sessions", "8")
    try:
        until_ready(d)
        yield d
    finally:
        code = d.stop()
        assert code == 0, d.stderr
        assert objects(shm_name(name)) == [], "a replica left its shared memory"


def kill(pid: int, _: random.Random) -> None:
    os.kill(pid, signal.SIGKILL)


def run_supervised(supervisor: DaemonProcess, count: int) -> None:
    stays, dies = f"{supervisor.name}-0", f"{supervisor.name}-1"
    with bystander(stays, null_model=True) as steady:
        stays_pid = pid_of(stays)
        assert stays_pid is not None
        baseline = Baseline.of(stays, stays_pid)
        parent = psutil.Process(supervisor.pid)
        fds, rss = parent.num_fds(), parent.memory_info().rss
        fresh = leftovers(dies)
        for number, rng in rounds(count):
            with replaying(number):
                workers = [
                    Worker(
                        "pool",
                        ([supervisor.name], number * 10 + k, rng.randrange(1 << 32), ROUND_S, None),
                    )
                    for k in range(rng.randint(2, 3))
                ]
                killed = pid_of(dies)
                assert killed is not None, supervisor.said()
                play(workers, rng, functools.partial(kill, killed))
                limit = time.monotonic() + 30
                while pid_of(dies) in (None, killed):
                    assert time.monotonic() < limit, supervisor.said()
                    time.sleep(0.05)
                ShmClient(dies, timeout=30).close()  # it serves again
                assert f"{dies} (pid {killed}) exited with -9; restarting" in supervisor.said()
                assert supervisor.process.poll() is None, supervisor.said()
                assert stays_pid == pid_of(stays), f"round {number}: {stays} was restarted"
                back_to_baseline(number, baseline, steady)
                as_new(number, dies, fresh)
                assert len(parent.children()) == 2, f"round {number}: {parent.children()}"
                assert parent.num_fds() <= fds + 2, f"round {number}: the supervisor leaks fds"
                grown = parent.memory_info().rss - rss
                assert grown < 32 << 20, f"round {number}: the supervisor grew {grown >> 20} MiB"


@short_and_soak({"count": 2}, {"count": 50})
def test_a_supervisor_whose_child_is_killed_each_round(
    supervisor: DaemonProcess, form: dict[str, Any]
) -> None:
    run_supervised(supervisor, **form)
