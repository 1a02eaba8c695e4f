"""A drain's moves are made at once (rte.client.in_flight), and the client's other
sessions stream meanwhile: against a SIGSTOPped daemon, every session's EXPORT is
in its inbox together (one after another, only the first would be), and a
session on the other daemon keeps getting its chunks while the moves wait. Then
the daemon goes on and every move ends, with no gap or repeat. Sync drain, the
reaction to ``rte drain``, and the asyncio drain."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from daemon_harness import DaemonProcess, Deadline
from test_drain import rte_drain

from rte.client import EngineClient, PoolClient, connect_pool
from rte.client.aio import Connecting
from rte.client.pool import PoolTransport
from rte.contract import NoticeKind
from rte.protocol.names import DaemonNames

MOVED = [f"m{i}" for i in range(8)]  # the sessions of the frozen daemon
# 9 rows; 2 client slots of 24 input slots each (--input-slots counts the daemon's)
SPARE_SLOTS = ("--max-sessions", "9", "--max-clients", "2", "--input-slots", "48")
SPARE_SLOTS += ("--input-slot-kib", "256")


@pytest.fixture
def frozen_pair(shm_prefix: str) -> Iterator[list[DaemonProcess]]:
    """Two daemons of the reference model, nine rows each (the SIGSTOPped one is
    always sent SIGCONT on the way out)."""
    started = [
        # (input slots to spare: every export holds one until its answer, and slots
        # the daemon gives back at its turns must not decide whether all 8 go at once)
        DaemonProcess(f"{shm_prefix}f-{i}", "--model", "reference", *SPARE_SLOTS)
        for i in range(2)
    ]
    yield started
    for d in started:
        if d.process.poll() is None:
            os.kill(d.pid, signal.SIGCONT)
            assert d.stop() == 0, d.stderr
        DaemonNames(d.name).remove_leftovers()


def _stop(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped (a signal is not synchronous: the
    daemon could take a request or two first, and the test's premise is gone)."""
    os.kill(pid, signal.SIGSTOP)
    limit = Deadline(10, "the daemon stopped")
    while _proc_state(pid) != "T":
        limit.check()
        time.sleep(0.001)


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def _placed(client: PoolClient, old: str, new: str) -> None:
    """``MOVED`` on ``old``, ``s`` on ``new``."""
    for session in [*MOVED, "s"]:
        client.attach(session, {"prompt": "forest"})
        want = new if session == "s" else old
        if client.home[session] != want:
            client.migrate(session, to=want)


def _waiting(client: Any, name: str) -> int:
    """Requests in daemon ``name``'s inbox from this client, not yet taken."""
    return int(client.transport.members[name].inbox.statistics().waiting)


def _chunks(client: Any, chunks: dict[str, list[int]], timeout: float = 0.1) -> None:
    chunk = client.poll(timeout=timeout)
    if chunk is not None:
        with chunk:
            chunks.setdefault(chunk.session, []).append(chunk.chunk)


def _seen(client: Any, name: str, chunks: dict[str, list[int]]) -> str:
    counts = {s: len(got) for s, got in chunks.items()}
    flights = getattr(client, "_drained", None)
    moving = ""
    if flights is not None:
        queued = [m.session for m, _, _ in flights._queued]
        moving = f", in flight {sorted(flights._flights)}, queued {queued}"
    return f"(inbox {_waiting(client, name)}, chunks {counts}{moving})"


def _no_gap(chunks: dict[str, list[int]]) -> None:
    for session, got in chunks.items():
        assert got == list(range(got[0], got[0] + len(got))), f"{session}: {got}"


def test_pool_drain_sends_every_export_before_any_answer(
    frozen_pair: list[DaemonProcess],
) -> None:
    old, new = frozen_pair
    with connect_pool([d.name for d in frozen_pair], timeout=30) as client:
        _placed(client, old.name, new.name)
        _stop(old.pid)
        moved: dict[str, str] = {}
        drain = threading.Thread(target=lambda: moved.update(client.drain(old.name, timeout=20)))
        drain.start()
        try:
            limit = Deadline(10, "every export in the frozen daemon's inbox")
            while _waiting(client, old.name) < len(MOVED):
                limit.check(_waiting(client, old.name))
                drain.join(0.01)
        finally:
            os.kill(old.pid, signal.SIGCONT)
            drain.join(30)
        assert moved == dict.fromkeys(MOVED, new.name)
        chunks: dict[str, list[int]] = {}
        limit = Deadline(what="the moved sessions' chunks")
        while any(len(chunks.get(s, [])) < 3 for s in MOVED):
            limit.check()
            _chunks(client, chunks)
        _no_gap(chunks)


def test_a_drained_daemons_moves_wait_together_while_the_others_stream(
    frozen_pair: list[DaemonProcess],
) -> None:
    """``rte drain``'s moves, at a poll: all the exports go at once, and the poll
    goes on handing out the other daemon's chunks while they wait for answers."""
    old, new = frozen_pair
    with connect_pool([d.name for d in frozen_pair], timeout=30) as client:
        _placed(client, old.name, new.name)
        drain = rte_drain(old.name, "--timeout", "30")
        limit = Deadline(what="the DRAINING notices")
        notices: list[Any] = []
        while len(client.transport.moves) < len(MOVED):  # (held by the pool: not moved yet)
            limit.check()
            notices += EngineClient.notices(client)  # (receives, moves nothing)
            time.sleep(0.02)
        _stop(old.pid)
        chunks: dict[str, list[int]] = {}
        try:
            limit = Deadline(10, "the moves waiting together, the other session streaming")
            while _waiting(client, old.name) < len(MOVED) or len(chunks.get("s", [])) < 5:
                limit.check(_seen(client, old.name, chunks))
                _chunks(client, chunks)
        finally:
            os.kill(old.pid, signal.SIGCONT)
        limit = Deadline(what="rte drain")
        while drain.poll() is None or any(len(chunks.get(s, [])) < 3 for s in MOVED):
            limit.check(f"{_seen(client, old.name, chunks)} homes {client.home}")
            _chunks(client, chunks)
            notices += client.notices()
        _, err = drain.communicate()
        assert drain.returncode == 0, err
        notices += client.notices()
        assert all(client.home[s] == new.name for s in MOVED)
        told = {n.session: n.message for n in notices if n.kind is NoticeKind.DRAINING}
        assert set(told) == set(MOVED) and all(f"moved to {new.name!r}" in m for m in told.values())
        _no_gap(chunks)


def test_the_asyncio_drain_sends_every_export_at_once_while_a_task_streams(
    frozen_pair: list[DaemonProcess],
) -> None:
    old, new = frozen_pair
    chunks: dict[str, list[int]] = {}

    async def main() -> None:
        names = [d.name for d in frozen_pair]
        async with Connecting(lambda: PoolTransport(names, timeout=30)) as client:
            for session in [*MOVED, "s"]:
                await client.attach(session, {"prompt": "forest"})
                want = new.name if session == "s" else old.name
                if client.transport.home[session] != want:  # type: ignore[attr-defined]
                    await client.migrate(session, to=want)
            _stop(old.pid)
            drain = asyncio.create_task(client.drain(old.name, timeout=20))
            try:
                limit = Deadline(10, "the exports together, the other session streaming")
                while _waiting(client, old.name) < len(MOVED) or len(chunks.get("s", [])) < 5:
                    limit.check(_seen(client, old.name, chunks))
                    await asyncio.sleep(0)  # (a chunk always ready: let the drain task run)
                    chunk = await client.poll(timeout=0.1)
                    if chunk is not None:
                        with chunk:
                            chunks.setdefault(chunk.session, []).append(chunk.chunk)
            finally:
                os.kill(old.pid, signal.SIGCONT)
            assert await drain == dict.fromkeys(MOVED, new.name)

    asyncio.run(asyncio.wait_for(main(), 60))
    _no_gap(chunks)


def test_a_drain_with_fewer_input_slots_than_sessions_moves_them_all(shm_prefix: str) -> None:
    """Each export takes an input slot of the client until its answer: with fewer
    slots than sessions, the rest wait for those slots to come back, then go."""
    old, new = started = [
        DaemonProcess(
            f"{shm_prefix}q-{i}",
            "--model",
            "reference",
            "--max-sessions",
            "9",
            "--max-clients",
            "1",
            "--input-slots",
            "4",
        )
        for i in range(2)
    ]
    try:
        with connect_pool([d.name for d in started], timeout=30) as client:
            _placed(client, old.name, new.name)
            assert client.drain(old.name, timeout=10) == dict.fromkeys(MOVED, new.name)
    finally:
        for d in started:
            if d.process.poll() is None:
                assert d.stop() == 0, d.stderr
            DaemonNames(d.name).remove_leftovers()
