"""An export given up on loses nothing (rte.client.transport.LateExports).

A client's ``export(s, timeout=...)`` (or a pool's move) that times out has still
sent its EXPORT: the engine carries it out when it comes round, lets the session
go and writes its state where the export said. The client keeps that slot lent
until the answer comes, reads the state and attaches the session again where it
was: it goes on at its next chunk, its frames a never-exported twin's, no slot
left held. Against a SIGSTOPped daemon (the export still in its inbox), and one
held inside the export it took up (``gated_export_model``: its slot already
checked, the state's bytes not yet written), over a plain client, a pool's
migrate, in process and on an event loop; a state the daemon then refuses is
kept in ``client.stranded``, an ERROR notice naming it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_harness import DaemonProcess, Deadline
from gated_export_model import Gate, GatedExport
from test_client import _frames_until
from test_drain_at_once import _stop

from rte import ComposedEngine
from rte.client import AsyncClient, EngineClient, InProcessClient, connect_pool
from rte.client.inprocess import InProcessTransport
from rte.client.pool import PoolTransport
from rte.client.shm import ShmTransport
from rte.contract import Notice, NoticeKind
from rte.errors import RequestTimeout
from rte.models import load_model
from rte.protocol.inputs import OWNER
from rte.protocol.names import DaemonNames
from rte.state import SessionState
from shm.slots import SlotRef

LAST = 14  # the chunk each test streams to
LATE = "may still be carried out"  # what the RequestTimeout says


def _twin(last: int = LAST) -> dict[int, Any]:
    """Session ``a``'s frames never exported, on an engine of this process."""
    with InProcessClient(ComposedEngine(load_model("reference", max_sessions=1))) as alone:
        alone.attach("a", {"prompt": "forest"})
        return _frames_until(alone, {"a": last})["a"]


def _same_as_twin(frames: dict[int, Any], twin: dict[int, Any]) -> None:
    last = max(frames)
    assert sorted(frames) == list(range(last + 1)), f"a gap in its chunks: {sorted(frames)}"
    for index, frame in frames.items():
        np.testing.assert_array_equal(frame, twin[index], err_msg=f"chunk {index}")


def _more(client: EngineClient, frames: dict[int, Any], last: int) -> list[Notice]:
    """Session ``a``'s frames until chunk ``last`` (none twice); the notices meanwhile."""
    news: list[Notice] = []
    limit = Deadline(what=f"'a' streaming to chunk {last}")
    while last not in frames:
        limit.check((sorted(frames)[-3:], news))
        chunk = client.poll(timeout=0.5)
        news += client.notices()
        if chunk is None:
            continue
        with chunk:
            if chunk.session == "a":
                assert chunk.chunk not in frames, f"chunk {chunk.chunk} came twice"
                frames[chunk.chunk] = chunk.latent.copy()
    return news


def _attached_again(news: list[Notice]) -> None:
    """The late export's news: an ATTACHED that says so, no ERROR (a stale slot...)."""
    assert [n for n in news if n.kind is NoticeKind.ERROR] == [], news
    said = [n.message for n in news if n.kind is NoticeKind.ATTACHED]
    assert any("carried out late" in m for m in said), news


def _went_on_as_twin(
    frames: dict[int, Any], news: list[Notice], said: str, twin: dict[int, Any]
) -> None:
    """What an event loop's test saw: the late export's news, the twin's frames, and
    a RequestTimeout that said it may still be carried out."""
    _attached_again(news)
    _same_as_twin(frames, twin)
    assert LATE in said, said


def _no_slot_held(client: EngineClient, members: list[ShmTransport]) -> None:
    """Every slot of the client's input segments free once its sessions left."""
    for member in members:
        slab = member.slot.lender.slab
        assert slab is not None
        limit = Deadline(what=f"{member.name}'s input slots all free")
        while slab.held(OWNER):
            limit.check(slab.held(OWNER))
            client.poll(timeout=0.05)


@pytest.fixture
def gate(tmp_path: Path) -> Gate:
    return Gate(tmp_path / "gate")


def _daemon(name: str, gate: Gate, *args: str) -> DaemonProcess:
    env = {"RTE_TEST_EXPORT_GATE": str(gate.path)}
    return DaemonProcess(name, "--model", "gated_export_model:gated_reference", *args, env=env)


@pytest.fixture
def daemon(shm_prefix: str, gate: Gate) -> Iterator[DaemonProcess]:
    """A daemon of the reference model with a gate in its export, one row."""
    started = _daemon(shm_prefix, gate, "--max-sessions", "1")
    yield started
    gate.open()
    if started.process.poll() is None:
        os.kill(started.pid, signal.SIGCONT)
        assert started.stop() == 0, started.stderr
    DaemonNames(started.name).remove_leftovers()


def _give_up_on_export(client: EngineClient, how: str, pid: int | None, gate: Gate) -> str:
    """``client``'s export of ``a`` times out: its daemon SIGSTOPped (the EXPORT in
    its inbox), or held inside the export it took up; then it goes on. What the
    RequestTimeout said."""
    if how == "stopped":
        assert pid is not None
        _stop(pid)
    else:
        gate.arm()
    try:
        with pytest.raises(RequestTimeout) as timed_out:
            client.export("a", timeout=0.5 if how == "stopped" else 3.0)
        if how == "gated":  # (the premise: it took the export up, and holds there)
            limit = Deadline(what="the daemon inside the export")
            while not gate.inside():
                limit.check()
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        gate.open()
    return str(timed_out.value)


def _timed_out_inside_export(client: EngineClient, gate: Gate) -> None:
    """``client``'s export of ``a`` times out while its daemon is held inside it (the
    gate stays shut: the test opens it)."""
    gate.arm()
    with pytest.raises(RequestTimeout):
        client.export("a", timeout=3.0)
    limit = Deadline(what="the daemon inside the export")
    while not gate.inside():
        limit.check()


@pytest.mark.parametrize("how", ["stopped", "gated"])
def test_an_export_timed_out_leaves_the_session_streaming_as_its_twin(
    daemon: DaemonProcess, gate: Gate, how: str
) -> None:
    """Carried out late, the export's session is attached again on its daemon: its
    chunks go on with no gap, its frames the twin's; an action sent meanwhile
    applies there; no input slot stays held."""
    twin = _twin()
    with daemon.client() as client:
        client.attach("a", {"prompt": "forest"}, credits=1)
        frames = _frames_until(client, {"a": 3})["a"]
        said = _give_up_on_export(client, how, daemon.pid, gate)
        assert client.sessions == {"a"}  # as the RequestTimeout left it
        seq = client.act("a", {"prompt": "forest"})  # (the same prompt: the twin's frames)
        news = _more(client, frames, LAST)
        _same_as_twin(frames, twin)
        _attached_again(news)
        assert client.sessions == {"a"} and client.stranded == {}
        applied = [c.applied for c in [client.poll(timeout=5.0)] if c is not None]
        assert applied and applied[0] >= seq, "the action sent meanwhile was not applied"
        client.detach("a")
        _no_slot_held(client, [client.transport])
    assert LATE in said, said


@pytest.fixture
def pair(shm_prefix: str, gate: Gate) -> Iterator[list[tuple[DaemonProcess, Gate]]]:
    """Two daemons of the reference model, each with its gate, two rows each."""
    gates = [gate, Gate(gate.path.with_name("other"))]
    started = [_daemon(f"{shm_prefix}p-{i}", gates[i], "--max-sessions", "2") for i in range(2)]
    yield list(zip(started, gates, strict=True))
    for d, g in zip(started, gates, strict=True):
        g.open()
        if d.process.poll() is None:
            os.kill(d.pid, signal.SIGCONT)
            assert d.stop() == 0, d.stderr
        DaemonNames(d.name).remove_leftovers()


def _hold(daemon: DaemonProcess, gate: Gate, how: str) -> None:
    """The daemon stops answering: SIGSTOPped, or held inside the next export."""
    if how == "stopped":
        _stop(daemon.pid)
    else:
        gate.arm()


def _go_on(daemon: DaemonProcess, gate: Gate, how: str) -> None:
    """It goes on (once, when held inside the export, it is there: the premise)."""
    try:
        limit = Deadline(what="the daemon inside the export")
        while how == "gated" and not gate.inside():
            limit.check()
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
        gate.open()


@pytest.mark.parametrize("how", ["stopped", "gated"])
def test_a_pool_migrate_whose_export_timed_out_goes_on_where_it_was(
    pair: list[tuple[DaemonProcess, Gate]], how: str
) -> None:
    """A migrate whose export gets no answer raises RequestTimeout; carried out
    late, the session is attached again on its own daemon, going on as its twin,
    and a migrate then moves it."""
    twin = _twin(LAST + 6)
    with connect_pool([d.name for d, _ in pair], timeout=30) as client:
        client.attach("a", {"prompt": "forest"}, credits=1)
        old = client.home["a"]
        (held, gate), (there, _) = sorted(pair, key=lambda p: p[0].name != old)
        frames = _frames_until(client, {"a": 3})["a"]
        _hold(held, gate, how)
        try:
            with pytest.raises(RequestTimeout) as timed_out:
                client.migrate("a", to=there.name, timeout=0.5 if how == "stopped" else 3.0)
        finally:
            _go_on(held, gate, how)
        _attached_again(_more(client, frames, LAST))
        assert client.home["a"] == old and client.sessions == {"a"}
        assert client.migrate("a", to=there.name) == there.name
        _more(client, frames, LAST + 6)
        _same_as_twin(frames, twin)
        client.detach("a")
        _no_slot_held(client, list(client.members.values()))
    assert LATE in str(timed_out.value), timed_out.value


def test_an_asyncio_pool_migrate_whose_export_timed_out_goes_on_where_it_was(
    pair: list[tuple[DaemonProcess, Gate]],
) -> None:
    twin = _twin(LAST + 6)

    async def main() -> tuple[dict[int, Any], list[Notice], str]:
        client = AsyncClient(PoolTransport([d.name for d, _ in pair], timeout=30))
        pool = client.transport
        assert isinstance(pool, PoolTransport)
        frames: dict[int, Any] = {}
        news: list[Notice] = []
        try:
            await client.attach("a", {"prompt": "forest"}, credits=1)
            old = pool.home["a"]
            (held, gate), (there, _) = sorted(pair, key=lambda p: p[0].name != old)
            await _poll_until(client, frames, news, 3)
            _hold(held, gate, "gated")
            try:
                with pytest.raises(RequestTimeout) as timed_out:
                    await client.migrate("a", to=there.name, timeout=3.0)
            finally:
                _go_on(held, gate, "gated")
            await _poll_until(client, frames, news, LAST)
            assert pool.home["a"] == old and client.sessions == {"a"}
            assert await client.migrate("a", to=there.name) == there.name
            await _poll_until(client, frames, news, LAST + 6)
        finally:
            await client.close()
        return frames, news, str(timed_out.value)

    _went_on_as_twin(*asyncio.run(main()), twin)


async def _poll_until(
    client: AsyncClient, frames: dict[int, Any], news: list[Notice], last: int
) -> None:
    """Session ``a``'s frames until chunk ``last`` (none twice), the notices into ``news``."""
    limit = Deadline(what=f"'a' streaming to chunk {last}")
    while last not in frames:
        limit.check((sorted(frames)[-3:], news))
        chunk = await client.poll(timeout=0.5)
        news += client.notices()
        if chunk is not None:
            with chunk:
                assert chunk.chunk not in frames, f"chunk {chunk.chunk} came twice"
                frames[chunk.chunk] = chunk.latent.copy()


def test_a_late_export_whose_state_its_daemon_then_refuses_is_kept_stranded(
    daemon: DaemonProcess, gate: Gate
) -> None:
    """Carried out late, its one row taken meanwhile by another client's session:
    the state is kept in ``client.stranded`` and an ERROR notice names it; attached
    from there once there is room, it goes on as its twin."""
    twin = _twin()
    with daemon.client() as client, daemon.client() as other:
        client.attach("a", {"prompt": "forest"}, credits=1)
        frames = _frames_until(client, {"a": 3})["a"]
        _timed_out_inside_export(client, gate)
        taking = threading.Thread(target=lambda: other.attach("b", timeout=30))
        taking.start()  # its attach waits in its inbox, the row's next taker
        limit = Deadline(what="the other client's attach in its inbox")
        while other.transport.inbox.statistics().waiting == 0 and taking.is_alive():
            limit.check()
        gate.open()
        taking.join(30)
        assert other.sessions == {"b"}
        news: list[Notice] = []
        limit = Deadline(what="the stranded state")
        while "a" not in client.stranded:
            limit.check(news)
            while (chunk := client.poll(timeout=0.2)) is not None:
                with chunk:
                    frames[chunk.chunk] = chunk.latent.copy()  # (emitted before it left)
            news += client.notices()
        errors = [n for n in news if n.kind is NoticeKind.ERROR and n.session == "a"]
        assert errors and "client.stranded['a']" in errors[0].message, news
        assert "a" not in client.sessions
        other.detach("b")
        client.attach("a", state=client.stranded.pop("a"), wait=10)
        _more(client, frames, LAST)
        _same_as_twin(frames, twin)


def test_a_daemon_never_writes_a_state_into_a_slot_given_back_meanwhile(
    daemon: DaemonProcess, gate: Gate
) -> None:
    """A client that gives its export's slot back while the daemon is taking the
    state out (an older client did, on a timeout; the slot may hold its next
    input by then): the daemon checks the slot again before it writes, writes
    nothing there and keeps the session, which streams on as its twin (the
    export refused: the late answer the client was waiting for)."""
    twin = _twin()
    with daemon.client() as client:
        client.attach("a", {"prompt": "forest"}, credits=1)
        frames = _frames_until(client, {"a": 3})["a"]
        transport, sent = client.transport, []
        export_into = transport.export_into
        transport.export_into = lambda r, t: sent.append(export_into(r, t)) or sent[-1]  # type: ignore[method-assign]
        _timed_out_inside_export(client, gate)
        ref, slab = sent[0].into, transport.slot.lender.slab
        assert slab is not None
        slab.release(SlotRef(ref.slot, ref.generation, OWNER))  # given back, then reused:
        at = slab.data_offset + ref.slot * slab.slot_size
        mine = slab.segment.view(at, np.dtype(np.uint8), 4096, (4096,), readonly=False)
        mine[:] = 0xA5
        gate.open()
        news = _more(client, frames, LAST)
        assert (mine == 0xA5).all(), "the daemon wrote a state into a slot given back"
        _same_as_twin(frames, twin)
        assert client.sessions == {"a"} and client.stranded == {}
        assert not [n for n in news if n.kind is NoticeKind.ATTACHED], news  # never left


def _gated_engine(gate: Gate) -> ComposedEngine:
    return ComposedEngine(GatedExport(gate=str(gate.path), max_sessions=1))


def test_an_in_process_export_timed_out_is_attached_again(gate: Gate) -> None:
    """In process the state goes into a box the engine's thread fills: carried out
    late, it is read from there and the session attached again."""
    twin = _twin()
    with InProcessClient(_gated_engine(gate), credits=1) as client:
        client.attach("a", {"prompt": "forest"})
        frames = _frames_until(client, {"a": 3})["a"]
        said = _give_up_on_export(client, "gated", None, gate)
        _attached_again(_more(client, frames, LAST))
        _same_as_twin(frames, twin)
        assert client.sessions == {"a"} and client.stranded == {}
    assert LATE in said, said


def test_an_export_tried_again_after_a_timeout_waits_for_the_late_one(gate: Gate) -> None:
    """A retried export waits for the late one to end (its session attached again),
    then exports: the state moves on elsewhere as the twin."""
    twin = _twin()
    with InProcessClient(_gated_engine(gate), credits=1) as client:
        client.attach("a", {"prompt": "forest"})
        frames = _frames_until(client, {"a": 3})["a"]
        _give_up_on_export(client, "gated", None, gate)
        state = client.export("a", timeout=20)
        assert client.sessions == set() and client.stranded == {}
        while (chunk := client.poll(timeout=0.3)) is not None:  # emitted before it left
            with chunk:
                assert chunk.chunk not in frames, f"chunk {chunk.chunk} came twice"
                frames[chunk.chunk] = chunk.latent.copy()
    with InProcessClient(ComposedEngine(load_model("reference", max_sessions=1))) as there:
        there.attach("a", state=state)
        _more(there, frames, LAST)
    _same_as_twin(frames, twin)


def test_an_asyncio_export_timed_out_is_attached_again(gate: Gate) -> None:
    twin = _twin()

    async def main() -> tuple[dict[int, Any], list[Notice], str]:
        client = AsyncClient(InProcessTransport(_gated_engine(gate), credits=1))
        frames: dict[int, Any] = {}
        news: list[Notice] = []
        try:
            await client.attach("a", {"prompt": "forest"})
            await _poll_until(client, frames, news, 3)
            gate.arm()
            with pytest.raises(RequestTimeout) as timed_out:
                await client.export("a", timeout=3.0)
            limit = Deadline(what="the engine's thread inside the export")
            while not gate.inside():
                limit.check()
            gate.open()
            await _poll_until(client, frames, news, LAST)
            assert client.sessions == {"a"} and client.stranded == {}
        finally:
            gate.open()
            await client.close()
        return frames, news, str(timed_out.value)

    _went_on_as_twin(*asyncio.run(main()), twin)


def test_a_state_exported_in_time_is_the_callers() -> None:
    """(The ordinary export is as it was: the state the caller's, nothing late.)"""
    with InProcessClient(ComposedEngine(load_model("reference", max_sessions=1))) as client:
        client.attach("a", {"prompt": "forest"})
        assert isinstance(client.export("a"), SessionState)
        assert client.sessions == set() and client.stranded == {}
