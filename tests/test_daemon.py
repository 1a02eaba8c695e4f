"""The daemon and the shm client, with real processes: streaming, zero copy,
ownership, and every fault of the failure model."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import daemon_workers
import numpy as np
import pytest
from daemon_harness import DaemonProcess, leftovers, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rte import AdmissionError
from rte.client import Client, EngineGone, RequestError
from rte.control import Control, names
from rte.daemon import remove_leftovers
from rte.wire import NoticeCode, RecordType, encode, encode_value
from shm import Segment

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    d = DaemonProcess(shm_prefix, "--max-sessions", "4", "--max-clients", "4", "--slab-slots", "16")
    yield d
    code = d.stop()
    remove_leftovers(shm_prefix)
    assert code == 0, d.stderr


def _chunks(client: Client, session: str, n: int, timeout: float = 20.0) -> list[int]:
    got: list[int] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {got[-3:]} of {n} chunks of {session}"
        chunk = client.poll(timeout=1.0)
        if chunk is None:
            continue
        with chunk:
            if chunk.session == session:
                got.append(chunk.chunk)
    return got


def _control(name: str) -> Control:
    return Control(Segment.open(names(name)["control"]))


def test_stream_chunks_as_zero_copy_views_of_the_slab(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        assert client.manifest.max_sessions == 4
        client.attach("a", {"prompt": "forest"})
        client.attach("b")
        seen: dict[str, list[int]] = {"a": [], "b": []}
        low = client._slab_segment.address
        high = low + client._slab_segment.size
        while min(len(v) for v in seen.values()) < 10:
            chunk = client.poll(timeout=10)
            assert chunk is not None
            with chunk:
                address = chunk.latent.__array_interface__["data"][0]
                assert low <= address < high  # the array *is* the slab memory
                assert not chunk.latent.flags.writeable
                assert chunk.latent.shape == client.manifest.latent_shape
                seen[chunk.session].append(chunk.chunk)
            assert chunk.released
        for chunks in seen.values():
            assert chunks == list(range(len(chunks)))
        client.act("a", {"move": (1, 0), "prompt": "city"})
        _chunks(client, "a", 5)
        assert client.held() == 0
        client.detach("a")
        client.detach("b")


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


def test_admission_and_bad_conditioning_reach_the_caller(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        with pytest.raises(RequestError, match="prompt must be a str"):
            client.attach("bad", {"prompt": 3})
        for i in range(4):
            client.attach(f"s{i}")
        with pytest.raises(AdmissionError, match="rows are in use"):
            client.attach("s4")
        with pytest.raises(RequestError, match="not attached"):
            client.detach("ghost")
        client.act("s0", {"move": "sideways"})
        wait_for(lambda: any("move must be two ints" in n.message for n in client.notices()))
    with daemon.client() as again:  # close() detached them all: the rows are free
        for i in range(4):
            again.attach(f"s{i}")


def test_reset_restarts_the_session_identically(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        client.attach("r", {"prompt": "p"})
        first = []
        while len(first) < 3:
            chunk = client.poll(timeout=10)
            assert chunk is not None
            with chunk:
                first.append((chunk.chunk, chunk.latent.copy()))
        client.reset("r")
        replay = {}
        deadline = time.monotonic() + 20
        while len(replay) < 3 and time.monotonic() < deadline:
            chunk = client.poll(timeout=1)
            if chunk is not None:
                with chunk:
                    if chunk.chunk < 3 and (chunk.chunk not in replay):
                        replay[chunk.chunk] = chunk.latent.copy()
        for index, latent in first:
            np.testing.assert_array_equal(replay[index], latent)


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
        entry = control.client(victim_index)
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
            while True:
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
        if d.process.poll() is None:
            d.kill()
        remove_leftovers(shm_prefix)


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


JUNK_SEQ = 0xFFFFFFF0  # never one of the client's own request numbers
garbage = st.one_of(
    st.binary(max_size=64),
    st.builds(
        lambda t, s, body: encode(RecordType(t), s, JUNK_SEQ, body=body),
        st.sampled_from([1, 2, 3, 4, 10, 11]),
        st.text(max_size=8),
        st.one_of(st.binary(max_size=32), st.just(encode_value({"move": (1, 2)}))),
    ),
    st.builds(
        lambda s: encode(RecordType.ATTACH, s, JUNK_SEQ, body=encode_value({"prompt": 1.5})),
        st.text(max_size=4),
    ),
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(records=st.lists(garbage, min_size=1, max_size=8))
def test_garbage_records_get_errors_and_the_daemon_keeps_serving(
    daemon: DaemonProcess, records: list[bytes]
) -> None:
    with daemon.client() as fuzzer, daemon.client() as bystander:
        bystander.attach("steady")
        for raw in records:
            fuzzer._inbox.push(raw, timeout=5)
        _chunks(bystander, "steady", 3)
        with contextlib.suppress(AdmissionError):  # the garbage may have filled the rows
            fuzzer.attach("after-the-garbage")  # the fuzzer itself is still answered
        if any(len(raw) < 8 for raw in records):  # not even a header: must be answered
            seen: list[NoticeCode] = []
            wait_for(
                lambda: (
                    NoticeCode.ERROR in seen or bool(seen.extend(n.code for n in fuzzer.notices()))
                )
            )


def test_a_client_that_stops_consuming_stalls_alone_then_is_detached(shm_prefix: str) -> None:
    d = DaemonProcess(
        shm_prefix,
        "--max-clients", "2", "--slab-slots", "8", "--idle-limit-s", "1.0",
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
            detached = [n for n in notices if n.code is NoticeCode.DETACHED]
            assert detached and "idle" in detached[0].message
            assert "lazy" not in lazy.sessions
            control = _control(shm_prefix)
            assert control.counters()["idle_detaches"] == 1
            control.segment.close()
            assert _chunks(busy, "busy", 10)
        assert d.stop() == 0
    finally:
        if d.process.poll() is None:
            d.kill()
        remove_leftovers(shm_prefix)
