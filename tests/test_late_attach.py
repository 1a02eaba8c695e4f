"""A move's attach given up on leaves no second copy (rte.client.late_attaches.LateAttaches).

A pool's move whose attach to its target gets no answer in its time (the target
SIGSTOPped) sends the state back to the daemon it came from, and the session goes
on there. That first attach is still in the target's inbox: taken up late, it
would attach the session there too, two live copies of one world stepping, the
target's chunks (the same indices) handed out as the session's, its home moved.
The client detaches that copy at once: the target holds no session, the stream
has no chunk twice, the frames are the never-moved twin's, and a move to the
target then works. A session the move left stranded (its old daemon full
meanwhile) is instead adopted where the late attach took it up. Over a pool's
sync client and its asyncio one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

import pytest
from daemon_harness import DaemonProcess, Deadline
from gated_export_model import Gate
from test_client import _frames_until
from test_drain_at_once import _stop
from test_late_export import (  # noqa: F401 (two gated daemons, as there)  # noqa: F401 (gate, pair: two gated daemons)
    LAST,
    _more,
    _no_slot_held,
    _poll_until,
    _same_as_twin,
    _twin,
    gate,
    pair,
)

from rte.client import AsyncClient, PoolClient, connect_pool
from rte.client.migration import MigrationError
from rte.client.pool import PoolTransport
from rte.client.shm import ShmTransport
from rte.contract import Notice, NoticeKind
from rte.errors import AdmissionError


def _bindings(member: ShmTransport) -> int:
    """How often the client's binding of a session to a handle of ``member``
    changed (up by one at each ATTACHED it read, and at each DETACHED)."""
    return member._bindings


def _copy_gone(pool: PoolTransport, there: str, before: int) -> bool:
    """Whether the target took up the late attach (its ATTACHED read) and its copy
    was detached (its DETACHED read, its row free again)."""
    return _bindings(pool.members[there]) >= before + 2 and pool.free_rows(there) == 2


def _not_the_copys(news: list[Notice]) -> None:
    """None of the copy's notices reached the caller, nor any error."""
    shown = [n for n in news if n.kind in (NoticeKind.ATTACHED, NoticeKind.DETACHED)]
    assert shown == [] and [n for n in news if n.kind is NoticeKind.ERROR] == [], news


def test_a_move_whose_attach_timed_out_leaves_no_copy_on_its_target(
    pair: list[tuple[DaemonProcess, Gate]],  # noqa: F811
) -> None:
    twin = _twin(LAST + 6)
    with connect_pool([d.name for d, _ in pair], timeout=30) as client:
        client.attach("a", {"prompt": "forest"}, credits=1)
        old = client.home["a"]
        there = next(d for d, _ in pair if d.name != old)
        frames = _frames_until(client, {"a": 3})["a"]
        before = _bindings(client.members[there.name])
        _stop(there.pid)
        try:
            with pytest.raises(AdmissionError) as refused:
                client.migrate("a", to=there.name, timeout=0.5)
        finally:
            os.kill(there.pid, signal.SIGCONT)
        assert "back on" in str(refused.value), refused.value
        news: list[Notice] = []
        limit = Deadline(what="the target's late copy taken up and detached")
        while not _copy_gone(client.transport, there.name, before) or LAST not in frames:
            limit.check((sorted(frames)[-3:], news, client.free_rows(there.name)))
            news += _more(client, frames, max(frames) + 1)
        _not_the_copys(news)
        assert client.home["a"] == old and client.sessions == {"a"}
        assert client.migrate("a", to=there.name) == there.name
        _more(client, frames, LAST + 6)
        _same_as_twin(frames, twin)
        client.detach("a")
        _no_slot_held(client, list(client.members.values()))


def test_an_asyncio_move_whose_attach_timed_out_leaves_no_copy_on_its_target(
    pair: list[tuple[DaemonProcess, Gate]],  # noqa: F811
) -> None:
    twin = _twin(LAST + 6)

    async def main() -> tuple[dict[int, Any], list[Notice]]:
        pool = PoolTransport([d.name for d, _ in pair], timeout=30)
        client = AsyncClient(pool)
        frames: dict[int, Any] = {}
        news: list[Notice] = []
        try:
            await client.attach("a", {"prompt": "forest"}, credits=1)
            old = pool.home["a"]
            there = next(d for d, _ in pair if d.name != old)
            await _poll_until(client, frames, news, 3)
            before = _bindings(pool.members[there.name])
            _stop(there.pid)
            try:
                with pytest.raises(AdmissionError):
                    await client.migrate("a", to=there.name, timeout=0.5)
            finally:
                os.kill(there.pid, signal.SIGCONT)
            limit = Deadline(what="the target's late copy taken up and detached")
            while not _copy_gone(pool, there.name, before) or LAST not in frames:
                limit.check((sorted(frames)[-3:], news))
                await _poll_until(client, frames, news, max(frames) + 1)
            _not_the_copys(news)
            assert pool.home["a"] == old and client.sessions == {"a"}
            assert await client.migrate("a", to=there.name) == there.name
            await _poll_until(client, frames, news, LAST + 6)
        finally:
            await client.close()
        return frames, news

    frames, _ = asyncio.run(main())
    _same_as_twin(frames, twin)


def test_a_stranded_move_is_adopted_where_its_late_attach_took_it_up(
    pair: list[tuple[DaemonProcess, Gate]],  # noqa: F811
) -> None:
    """The target stopped (its attach given up on) and the old daemon full by the
    time the state comes back (another client's session took the row the export
    freed): the move raises MigrationError. The target, going on, takes up the
    late attach: the session lives there now (an ATTACHED notice says so), going
    on from its state as its twin."""
    twin = _twin()
    with connect_pool([d.name for d, _ in pair], timeout=30) as client:
        client.attach("a", {"prompt": "forest"}, credits=1)
        old = client.home["a"]
        (held, gate_of_old), (there, _) = sorted(pair, key=lambda p: p[0].name != old)
        with held.client() as other:
            other.attach("x", timeout=30)  # (its two rows taken: "a" and "x")
            frames = _frames_until(client, {"a": 3})["a"]
            failed = _migrate_stranded(client, held, gate_of_old, there, other)
            assert isinstance(failed, MigrationError), failed
            assert other.sessions == {"x", "y"}
            os.kill(there.pid, signal.SIGCONT)
            news: list[Notice] = []
            limit = Deadline(what="the late attach adopted")
            while client.home.get("a") != there.name or "a" not in client.sessions:
                limit.check(news)
                chunk = client.poll(timeout=0.2)
                news += client.notices()
                if chunk is not None:
                    with chunk:
                        assert chunk.chunk not in frames, f"chunk {chunk.chunk} came twice"
                        frames[chunk.chunk] = chunk.latent.copy()
            said = [n.message for n in news if n.kind is NoticeKind.ATTACHED]
            assert len(said) == 1 and "carried out late" in said[0], news
            news += _more(client, frames, LAST)
            assert [n for n in news if n.kind is NoticeKind.ERROR] == [], news
            _same_as_twin(frames, twin)
            assert client.stranded == {} and client.sessions == {"a"}
            client.detach("a")
            other.detach("x")
            other.detach("y")


def _migrate_stranded(
    client: PoolClient,
    held: DaemonProcess,
    gate: Gate,  # noqa: F811 (that daemon's)
    there: DaemonProcess,
    other: Any,
) -> BaseException | None:
    """``client``'s move of ``a`` to ``there`` (stopped: its attach given up on),
    its old daemon ``held`` inside the export meanwhile, ``other``'s attach of
    ``y`` in its inbox to take the row the export frees; what the move raised."""
    _stop(there.pid)
    raised: list[BaseException] = []

    def move() -> None:
        try:
            client.migrate("a", to=there.name, timeout=3.0)
        except BaseException as exc:  # (handed to the test)
            raised.append(exc)

    gate.arm()
    moving = threading.Thread(target=move)
    moving.start()
    try:
        limit = Deadline(what="the old daemon inside the export")
        while not gate.inside():
            limit.check()
        taking = threading.Thread(target=lambda: other.attach("y", timeout=30))
        taking.start()
        limit = Deadline(what="the other client's attach in the old daemon's inbox")
        while other.transport.inbox.statistics().waiting == 0 and taking.is_alive():
            limit.check()
    finally:
        gate.open()
    taking.join(30)
    moving.join(30)
    assert not moving.is_alive()
    return raised[0] if raised else None
