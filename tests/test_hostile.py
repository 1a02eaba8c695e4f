"""Nothing a client sends or does can kill the daemon or hurt another client.

Real daemons, real client processes, hostile and clumsy traffic on purpose:
answers too big for a ring, floods, starts and signals at awkward moments,
forged segments, mistakes on the command line.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import psutil
import pytest
from daemon_harness import DaemonProcess, RawClient, leftovers, running, take, wait_for

from rte import EngineGone, NoticeKind, RequestError
from rte.client import ShmClient
from rte.contract import Notice
from rte.protocol.control import KIND_CONTROL, DaemonState, Layout
from rte.protocol.names import DaemonNames
from rte.protocol.values import ARRAY_EXT
from rte.protocol.wire import HEADER, RecordType, decode_reply
from shm import Segment
from shm.native import lib
from shm.segment import HEADER_SIZE


@pytest.fixture
def small_rings(shm_prefix: str) -> Iterator[DaemonProcess]:
    """A daemon whose client rings are 4 KiB (a record of at most 2,040 bytes)."""
    d = DaemonProcess(shm_prefix, "--ring-kib", "4", "--max-clients", "3")
    yield d
    assert d.stop() == 0, d.stderr


def _raw(kind: int, session: bytes, body: bytes = b"", seq: int = 77) -> bytes:
    return HEADER.pack(kind, 0, len(session), seq, 0) + session + body


def _answers(raw: RawClient, n: int) -> list[Notice]:
    got: list[Notice] = []

    def more() -> bool:
        got.extend(
            r for r in map(decode_reply, raw.outbox.pop_batch_nowait()) if isinstance(r, Notice)
        )
        return len(got) >= n

    wait_for(more, what=f"{n} answers")
    return got


def test_an_answer_too_big_for_the_ring_is_cut_never_fatal(small_rings: DaemonProcess) -> None:
    with small_rings.client() as bystander, small_rings.client() as clumsy:
        bystander.attach("steady")
        clumsy.attach("a")
        clumsy.act("a", {"move": b"\x00" * 1900})  # fits the ring; its quoted repr is 4x that
        raw = RawClient(small_rings.name)
        raw.inbox.push(_raw(RecordType.DETACH, b"g" * 1000), timeout=5)  # quoted twice: too big
        (detach,) = _answers(raw, 1)
        assert detach.kind is NoticeKind.ERROR and detach.seq == 77  # answered, cut to fit
        assert "session id of 1000 bytes is longer than 256" in detach.message
        wait_for(
            lambda: any(n.message.endswith("[truncated]") for n in clumsy.notices()),
            what="the cut answer to the action",
        )
        raw.close()
        stream = [c.chunk for c in take(bystander, "steady", 5)]
        assert stream == list(range(stream[0], stream[0] + 5))
        assert take(clumsy, "a", 2)  # the clumsy client is served on, too


def test_a_session_id_no_answer_could_quote_is_refused(shm_prefix: str) -> None:
    with running(shm_prefix) as d:
        d.client().close()
        raw = RawClient(d.name)
        raw.inbox.push(_raw(RecordType.DETACH, b"x" * 65_000), timeout=5)  # 64 KiB of id
        (answer,) = _answers(raw, 1)
        assert answer.kind is NoticeKind.ERROR and answer.session == "" and answer.seq == 77
        assert "longer than 256" in answer.message
        raw.close()
        with d.client() as client:
            client.attach("after")
            assert take(client, "after", 2)


def test_a_flood_without_reading_is_bounded_in_bytes_and_told(shm_prefix: str) -> None:
    with (
        running(shm_prefix, "--max-sessions", "2") as d,
        d.client() as flooder,
        d.client() as bystander,
    ):
        bystander.attach("steady")
        flooder.attach("a")
        daemon = psutil.Process(d.pid)
        before = daemon.memory_info().rss
        for _ in range(600):  # each refused with a 100 KB quote of itself, none read
            flooder.act("a", {"move": "x" * 100_000}, timeout=10)
        wait_for(lambda: daemon.memory_info().rss > 0, what="the daemon")  # still there
        grown = daemon.memory_info().rss - before
        assert grown < 40 << 20, f"the daemon grew by {grown / 2**20:.0f} MiB"
        told = []
        deadline = time.monotonic() + 10
        while not any("were dropped" in n.message for n in told):
            assert time.monotonic() < deadline, [n.message[:80] for n in told]
            flooder.poll(timeout=0.1)
            told += flooder.notices()
        stream = [c.chunk for c in take(bystander, "steady", 5)]
        assert stream == list(range(stream[0], stream[0] + 5))


def test_a_client_that_floods_on_is_disconnected_and_others_go_on(shm_prefix: str) -> None:
    with running(shm_prefix, "--ring-kib", "4", "--idle-limit-s", "0.5") as d:
        with d.client() as flooder, d.client() as bystander:
            bystander.attach("steady")
            flooder.attach("a")
            flooding = threading.Event()
            flooding.set()
            reader = threading.Thread(target=_consume, args=(bystander, flooding), daemon=True)
            reader.start()  # the bystander keeps reading (else it is idle, and detached)
            try:
                with pytest.raises(EngineGone, match="disconnected this client"):
                    deadline = time.monotonic() + 20
                    while time.monotonic() < deadline:
                        flooder.act("ghost", {"move": (0, 1)})
            finally:
                flooding.clear()
                reader.join(10)
            counters = _counters(d.name)
            assert counters["clients_disconnected"] == 1
            stream = [c.chunk for c in take(bystander, "steady", 5)]
            assert stream == list(range(stream[0], stream[0] + 5))
            bystander.attach("a")  # the flooder's session was detached: its row is free
        with d.client() as again:  # and its slot was given back when it closed
            again.attach("b")


def _consume(client: ShmClient, going: threading.Event) -> None:
    while going.is_set():
        chunk = client.poll(timeout=0.05)
        if chunk is not None:
            chunk.release()


def _counters(name: str) -> dict[str, int]:
    from rte.protocol.control import Control  # noqa: PLC0415

    with Segment.open(DaemonNames(name).control, readonly=True) as segment:
        return Control(segment).counters()


def test_connecting_while_the_daemon_starts_waits_instead_of_failing(shm_prefix: str) -> None:
    names = DaemonNames(shm_prefix)
    layout = Layout(max_clients=4, ring_capacity=4096, handles=8)
    starting = Segment.create(names.control, layout.size, kind=KIND_CONTROL)  # state STARTING
    try:
        t0 = time.monotonic()
        with pytest.raises(EngineGone, match="did not become ready in time"):
            ShmClient(shm_prefix, timeout=0.5)
        assert time.monotonic() - t0 >= 0.4  # it waited, rather than read a half-made table
    finally:
        starting.close()
        starting.unlink()


def test_a_forged_table_size_is_refused_not_read_past_its_end(shm_prefix: str) -> None:
    names = DaemonNames(shm_prefix)
    forged = Segment.create(names.control, 3 * HEADER_SIZE, kind=KIND_CONTROL)
    try:
        block = HEADER_SIZE
        lib.shm_store_release(forged.word(block + 64), 1000)  # max_clients: far past the end
        lib.shm_store_release(forged.word(block + 72), 4096)  # ring capacity
        lib.shm_store_release(forged.word(block + 80), 8)  # max sessions
        lib.shm_store_release(forged.word(block), DaemonState.READY)
        with pytest.raises(EngineGone, match="need"):
            ShmClient(shm_prefix, timeout=1)
    finally:
        forged.close()
        forged.unlink()


def test_a_client_cannot_write_into_the_slab(shm_prefix: str) -> None:
    with running(shm_prefix) as d, d.client() as client:
        client.attach("a")
        chunk = take(client, "a", 1)[0]
        with pytest.raises(ValueError, match="WRITEABLE"):
            chunk.latent.flags.writeable = True
        with pytest.raises((ValueError, TypeError)):
            np.frombuffer(chunk.latent.data, np.uint8)[0] = 1


def test_sigterm_while_the_model_loads_exits_0_and_leaves_nothing(
    shm_prefix: str, tmp_path: Path
) -> None:
    marker = tmp_path / "loading"
    d = DaemonProcess(
        shm_prefix, "--model", "slow_model:slow_reference", env={"RTE_TEST_LOADING": str(marker)}
    )
    wait_for(marker.exists, timeout=30, what="the model to start loading")
    assert d.stop() == 0, d.stderr
    assert leftovers(shm_prefix) == []


def test_sigterm_while_a_long_load_runs_stops_the_daemon_without_waiting_for_it(
    shm_prefix: str, tmp_path: Path
) -> None:
    """A model that takes minutes to load (weights from a slow disk) is no reason
    to ignore a stop: the daemon exits at once, cleanly, and says why."""
    marker = tmp_path / "loading"
    env = {"RTE_TEST_LOADING": str(marker), "RTE_TEST_LOAD_S": "300"}
    d = DaemonProcess(shm_prefix, "--model", "slow_model:slow_reference", env=env)
    wait_for(marker.exists, timeout=30, what="the model to start loading")
    began = time.monotonic()
    assert d.stop(timeout=20) == 0, d.stderr  # (past 20 s it is killed: not 0)
    assert time.monotonic() - began < 20
    assert "stopped while the model was loading" in d.stderr
    assert "Traceback" not in d.stderr
    assert leftovers(shm_prefix) == []


@pytest.mark.parametrize("delay", [0.0, 0.15, 0.3, 0.5, 0.8])
def test_a_signal_at_any_moment_of_start_up_leaves_nothing(shm_prefix: str, delay: float) -> None:
    d = DaemonProcess(shm_prefix)
    time.sleep(delay)
    code = d.stop()
    # before Python has even imported rte, SIGTERM ends it the default way
    assert code in (0, -signal.SIGTERM), d.stderr
    assert "Traceback" not in d.stderr
    assert leftovers(shm_prefix) == []


def test_simultaneous_starts_of_one_name_leave_one_daemon(shm_prefix: str) -> None:
    starts = [DaemonProcess(shm_prefix) for _ in range(4)]
    try:
        wait_for(
            lambda: sum(s.process.poll() is not None for s in starts) >= 3,
            timeout=60,
            what="three of the four to give up",
        )
        (winner,) = [s for s in starts if s.process.poll() is None]
        for loser in starts:
            if loser is not winner:
                assert loser.stop() == 2, loser.stderr
                (line,) = loser.stderr.strip().splitlines()
                assert f"a daemon named {shm_prefix!r} is" in line
        with winner.client() as client:
            client.attach("a")
            assert take(client, "a", 1)
    finally:
        assert all(s.stop() in (0, 2) for s in starts)
    assert leftovers(shm_prefix) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--name", "bad name"], "daemon name 'bad name'"),
        (["--max-sessions", "0"], "--max-sessions 0: must be at least 1"),
        (["--max-clients", "0"], "--max-clients 0: must be at least 1"),
        (["--quota", "-1"], "--quota -1: must be at least 0"),
        (["--quota", "8", "--slab-slots", "8", "--max-clients", "2"], "clients could starve"),
        (["--model", "bogus"], "model 'bogus' is neither"),
        (["--ring-kib", "-4"], "--ring-kib -4: must be at least 4"),
        (["--idle-limit-s", "-1"], "--idle-limit-s -1.0: must be more than 0"),
        (["--pace-hz", "-1"], "--pace-hz -1.0: must be 0"),
    ],
)
def test_a_setting_that_cannot_hold_is_one_line_and_exit_2(
    shm_prefix: str, args: list[str], says: str
) -> None:
    argv = ["--name", shm_prefix, *args] if args[0] != "--name" else args
    done = _rte("serve", *argv)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("rte serve: ") and says in line
    assert leftovers(shm_prefix) == []


def test_inspect_answers_mistakes_in_one_line(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix)
    try:
        d.client().close()
        done = _rte("inspect", shm_prefix, "--ring", "99")
        assert done.returncode == 1
        assert done.stderr.strip() == "rte inspect: client 99 does not exist (0..7)"
        assert _rte("inspect", "--json").returncode == 0
        assert "usage: rte inspect" in _rte("inspect", "--help").stdout
    finally:
        assert d.stop() == 0


def test_an_impostor_segment_is_an_unreadable_row_not_a_crash(shm_prefix: str) -> None:
    names = DaemonNames(shm_prefix)
    impostor = Segment.create(names.control, 2 * HEADER_SIZE, kind=KIND_CONTROL)
    try:
        impostor.bytes_at(HEADER_SIZE, HEADER_SIZE)[:] = os.urandom(HEADER_SIZE)
        listing = _rte("inspect")
        assert listing.returncode == 0, listing.stderr
        (row,) = [line for line in listing.stdout.splitlines() if line.startswith(shm_prefix)]
        assert "unreadable" in row
        detail = _rte("inspect", shm_prefix)
        assert detail.returncode == 1 and "Traceback" not in detail.stderr
        assert len(detail.stderr.strip().splitlines()) == 1
    finally:
        impostor.close()
        impostor.unlink()


def _rte(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rte", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_array_no_numpy_can_make_is_refused_and_serving_goes_on(
    small_rings: DaemonProcess,
) -> None:
    with small_rings.client() as bystander:
        bystander.attach("steady")
        raw = RawClient(small_rings.name)
        array = bytes([2, 3]) + b"<f4" + (0).to_bytes(8, "little")
        array += (2**63).to_bytes(8, "little")  # no bytes to read; no such array either
        body = b"\x81\xa1x" + msgspec.msgpack.encode(msgspec.msgpack.Ext(ARRAY_EXT, array))
        raw.inbox.push(_raw(RecordType.ATTACH, b"a", body), timeout=5)
        (answer,) = _answers(raw, 1)
        assert answer.kind is NoticeKind.ERROR and "no array of shape" in answer.message
        raw.close()
        stream = [c.chunk for c in take(bystander, "steady", 5)]
        assert stream == list(range(stream[0], stream[0] + 5))


def test_a_session_the_engine_will_not_detach_is_never_left_to_a_gone_client(
    shm_prefix: str,
) -> None:
    with running(shm_prefix, "--model", "stubborn_model:stubborn") as d:
        with d.client() as first:
            first.attach("x")
            assert take(first, "x", 2)
        with d.client() as second:  # "x" belonged to a client that left: nobody owns it now
            with pytest.raises(RequestError, match="'x' is being detached"):
                second.attach("x")
            second.attach("y")
            assert take(second, "y", 2)
        assert _counters(d.name)["errors"] >= 1


def test_signals_over_and_over_while_it_stops_still_exit_0(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix)
    with d.client() as client:
        client.attach("a")
        assert take(client, "a", 2)
        limit = time.monotonic() + 30
        while d.process.poll() is None and time.monotonic() < limit:
            d.process.send_signal(signal.SIGTERM)
            time.sleep(0.01)
    assert d.stop() == 0, d.stderr
    assert leftovers(shm_prefix) == []


def _open_as_nobody(names: list[str], conn: Any) -> None:
    """In a forked child: become user nobody, try to open another user's objects."""
    from shm import Doorbell, SegmentError  # noqa: PLC0415

    os.setgid(65534)
    os.setuid(65534)
    said = []
    for name in names:
        try:
            (Doorbell if name.endswith(".bell") else Segment.open)(name)
            said.append(f"{name}: opened")
        except SegmentError as exc:
            said.append(str(exc))
        except Exception as exc:
            said.append(f"{name}: escaped {type(exc).__name__}: {exc}")
    conn.send(said)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become another user")
def test_another_users_objects_are_a_clear_refusal(shm_prefix: str) -> None:
    with running(shm_prefix) as d:
        d.client().close()
        names = DaemonNames(shm_prefix)
        fork = multiprocessing.get_context("fork")
        parent, child = fork.Pipe()
        other = fork.Process(target=_open_as_nobody, args=([names.control, names.bell], child))
        other.start()
        assert parent.poll(30)
        said = parent.recv()
        other.join(10)
        assert all("belongs to another user" in line for line in said), said


def test_a_client_that_scribbles_on_its_own_claim_disturbs_nobody(shm_prefix: str) -> None:
    with running(shm_prefix, "--max-clients", "2") as d:
        with d.client() as bystander:
            bystander.attach("steady")
            raw = RawClient(d.name)
            raw.inbox.push(_raw(RecordType.DETACH, b"ghost"), timeout=5)
            _answers(raw, 1)  # answered: the daemon serves it
            claim = HEADER_SIZE + 128 * (1 + raw.index)  # its claim's state word
            lib.shm_store_release(raw.claims_segment.word(claim), 0xFFFF_FFFF)  # no state at all
            raw.inbox.push(_raw(RecordType.DETACH, b"ghost"), timeout=5)
            _answers(raw, 1)  # still served: the daemon judges a slot it holds by its own record
            stream = [c.chunk for c in take(bystander, "steady", 5)]
            assert stream == list(range(stream[0], stream[0] + 5))
            raw.close()
            with d.client() as again:  # the only free slot is the one whose claim was garbage
                again.attach("after")
                assert again.index == raw.index
        assert _counters(d.name)["dead_clients_reaped"] == 0
