"""The daemon and the shm client, with real processes: zero copy, ownership
across processes, and every fault of the failure model. (What a caller sees on
either client form is in test_client.py.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import daemon_workers
import pytest
from daemon_harness import (
    DaemonProcess,
    Deadline,
    RawClient,
    leftovers,
    mapped_file,
    slab_file,
    take,
    wait_for,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rte import NoticeKind
from rte.client import EngineClient, EngineGone, RequestError
from rte.contract import Notice
from rte.protocol.control import Control
from rte.protocol.names import DaemonNames
from rte.protocol.values import encode_value
from rte.protocol.wire import HEADER, RecordType, decode_reply
from shm import Segment

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams


SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    d = DaemonProcess(shm_prefix, "--max-sessions", "4", "--max-clients", "4")
    yield d
    assert d.stop() == 0, d.stderr
    assert leftovers(shm_prefix) == []


def _chunks(client: EngineClient, session: str, n: int) -> list[int]:
    return [chunk.chunk for chunk in take(client, session, n)]


def _control(name: str) -> Control:
    return Control(Segment.open(DaemonNames(name).control))


def test_chunks_are_views_of_the_daemons_slab_itself(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        assert client.manifest.max_sessions == 4
        client.attach("a", {"prompt": "forest"})
        for _ in range(10):
            chunk = client.poll(timeout=10)
            assert chunk is not None
            with chunk:
                address = chunk.latent.__array_interface__["data"][0]
                assert mapped_file(address) == slab_file(daemon.name)  # it *is* the slab
                assert not chunk.latent.flags.writeable
        assert client.held() == 0


def test_sessions_belong_to_their_client(daemon: DaemonProcess) -> None:
    with daemon.client() as alice, daemon.client() as mallory:
        alice.attach("mine")
        for call in (
            lambda: mallory.attach("mine"),
            lambda: mallory.detach("mine"),
            lambda: mallory.reset("mine"),
        ):
            with pytest.raises(RequestError, match="belongs to another client"):
                call()
        mallory.act("mine", {"move": (1, 1)})
        wait_for(lambda: any("another client" in n.message for n in mallory.notices()))
        _chunks(alice, "mine", 3)


def test_a_client_killed_mid_stream_is_reaped_and_others_see_no_gap(
    daemon: DaemonProcess,
) -> None:
    parent, child = SPAWN.Pipe()
    victim = SPAWN.Process(
        target=daemon_workers.stream_forever, args=(daemon.name, ["v0", "v1"], child)
    )
    victim.start()
    assert parent.poll(30)
    victim_index = parent.recv()
    with daemon.client() as client:
        client.attach("watch")
        before = _chunks(client, "watch", 20)
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        after = _chunks(client, "watch", 40)
        stream = before + after
        assert stream == list(range(len(stream)))  # every chunk, in order
        control = _control(daemon.name)
        wait_for(lambda: control.counters()["dead_clients_reaped"] == 1, what="reaping")
        entry = control.table.entry(victim_index)
        assert entry.state.name == "FREE" and entry.sessions == 0
        control.segment.close()
        client.attach("v0")  # its rows were given back
        client.attach("v1")


def test_a_killed_daemon_is_engine_gone_within_a_second(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix, "--max-sessions", "2")
    try:
        client = d.client()
        client.attach("a")
        assert client.poll(timeout=10) is not None
        d.kill()
        t0 = time.monotonic()
        with pytest.raises(EngineGone, match="died"):
            limit = Deadline(10, "EngineGone")
            while True:
                limit.check()
                chunk = client.poll(timeout=30)
                if chunk is not None:
                    chunk.release()
        assert time.monotonic() - t0 < 3.0
        with pytest.raises(EngineGone):
            client.attach("b")
        client.close()
        assert leftovers(shm_prefix)  # a crash leaves its segments...
        again = DaemonProcess(shm_prefix, "--max-sessions", "2")  # ...the next daemon replaces them
        with again.client() as fresh:
            fresh.attach("a")
            assert fresh.poll(timeout=10) is not None
        assert again.stop() == 0
        assert leftovers(shm_prefix) == []
    finally:
        if d.process.poll() is None:  # the test failed with it running
            d.kill()
            DaemonNames(shm_prefix).remove_leftovers()


def test_a_live_daemon_of_the_same_name_is_refused(daemon: DaemonProcess) -> None:
    daemon.client().close()  # it is up
    second = subprocess.run(
        [sys.executable, "-m", "rte", "serve", "--name", daemon.name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 2
    assert f"a daemon named {daemon.name!r} is already running (pid {daemon.pid})" in second.stderr
    with daemon.client() as client:  # and the first one is untouched
        client.attach("x")
        _chunks(client, "x", 2)


def test_sigterm_finalizes_and_unlinks_everything(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix)
    client = d.client()
    client.attach("a")
    _chunks(client, "a", 3)
    assert leftovers(shm_prefix)
    assert d.stop() == 0
    assert leftovers(shm_prefix) == []
    delivered = []
    with pytest.raises(EngineGone, match=r"stopping|died"):
        for _ in range(10_000):  # what was delivered before it stopped is still readable
            chunk = client.poll(timeout=5)
            assert chunk is not None
            with chunk:
                delivered.append(chunk.chunk)
    assert delivered == sorted(delivered)
    client.close()


def test_a_burst_of_sigterms_still_stops_it_cleanly(shm_prefix: str) -> None:
    """Signals come in bursts (a parent that dies with PR_SET_PDEATHSIG set sends
    one per thread of it as they end): one arriving while the handler of the one
    before runs must not hang the daemon (its handler once waited on a lock it
    held itself, for ever)."""
    d = DaemonProcess(shm_prefix)
    with d.client() as client:
        client.attach("a")
        _chunks(client, "a", 3)
        d.burst()
    assert d.stop(timeout=20) == 0, d.stderr
    assert "stopped; its shared memory is unlinked" in d.stderr
    assert leftovers(shm_prefix) == []


def _record(kind: int, session: str, body: bytes) -> bytes:
    name = session.encode()
    return HEADER.pack(kind, 0, len(name), 77, 0) + name + body


garbage = st.one_of(
    st.binary(max_size=64),
    st.builds(
        _record,
        st.sampled_from([1, 2, 3, 4, 10, 11, 99]),  # not 5, BYE: the fuzzer would be gone
        st.text(max_size=8),
        st.one_of(st.binary(max_size=32), st.just(encode_value({"move": (1, 2)}))),
    ),
    st.builds(
        lambda s: _record(RecordType.ATTACH, s, encode_value({"prompt": 1.5})), st.text(max_size=4)
    ),
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(records=st.lists(garbage, min_size=1, max_size=8))
def test_garbage_records_get_errors_and_the_daemon_keeps_serving(
    daemon: DaemonProcess, records: list[bytes]
) -> None:
    with daemon.client() as bystander:
        bystander.attach("steady")
        fuzzer = RawClient(daemon.name)
        for raw in records:
            fuzzer.inbox.push(raw, timeout=5)
        _chunks(bystander, "steady", 3)
        if any(len(raw) < HEADER.size for raw in records):  # not even a header: answered
            wait_for(
                lambda: any(
                    isinstance(reply, Notice) and reply.kind is NoticeKind.ERROR
                    for reply in map(decode_reply, fuzzer.outbox.pop_batch_nowait())
                ),
                what="an ERROR answer to the record that was not even a header",
            )
        fuzzer.close()  # BYE: whatever its garbage attached is detached
        with daemon.client() as honest:
            for i in range(3):
                honest.attach(f"after-{i}")
            _chunks(honest, "after-2", 2)
        _chunks(bystander, "steady", 2)


def test_a_client_that_stops_consuming_stalls_alone_then_is_detached(shm_prefix: str) -> None:
    d = DaemonProcess(
        shm_prefix,
        "--max-clients", "2", "--idle-limit-s", "1.0",
    )  # fmt: skip
    try:
        with d.client() as lazy, d.client() as busy:
            lazy.attach("lazy")
            busy.attach("busy")
            stream: list[int] = []
            until = time.monotonic() + 1.8  # past the idle limit, busy consuming all along
            while time.monotonic() < until:
                stream += _chunks(busy, "busy", 10)
            assert stream == list(range(len(stream)))  # busy never stalled behind lazy
            notices = lazy.notices()
            detached = [n for n in notices if n.kind is NoticeKind.DETACHED]
            assert detached and "idle" in detached[0].message
            assert "lazy" not in lazy.sessions
            control = _control(shm_prefix)
            assert control.counters()["idle_detaches"] == 1
            control.segment.close()
            assert _chunks(busy, "busy", 10)
        assert d.stop() == 0
    finally:
        if d.process.poll() is None:  # the test failed with it running
            d.kill()
            DaemonNames(shm_prefix).remove_leftovers()


def test_close_gives_back_the_client_slot_and_rows_at_once(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix, "--max-clients", "1", "--max-sessions", "2", "--slab-slots", "4")
    try:
        for _ in range(5):  # each connect and attach right after the last close
            client = d.client()
            client.attach("a")
            client.attach("b")
            _chunks(client, "b", 1)
            client.close()
        assert d.stop() == 0
    finally:
        if d.process.poll() is None:  # the test failed with it running
            d.kill()
            DaemonNames(shm_prefix).remove_leftovers()
