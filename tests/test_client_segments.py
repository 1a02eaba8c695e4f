"""What a client can write, by construction (issue 20, item 2): its own mailbox
(rings, credits), the claims, its own input segment and the slab's slot words;
the control segment (the daemon's state, counters and roster) only read-only,
and no other client's mailbox or inputs at all. Read from /proc/PID/maps of a
real client process; and a client that writes garbage over everything it maps
writable of its own leaves a bystander's stream whole."""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
from collections.abc import Iterator
from typing import Any

import pytest
from daemon_harness import DaemonProcess, RawClient, take, wait_for

from rte.client import connect
from rte.protocol.control import KIND_CONTROL, Control, DaemonState
from rte.protocol.names import DaemonNames
from shm import Segment
from shm.names import SHM_DIR
from shm.native import lib
from shm.segment import HEADER_SIZE


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    d = DaemonProcess(shm_prefix, "--max-clients", "3")
    try:
        yield d
    finally:
        assert d.stop() == 0, d.stderr


def _file(name: str) -> str:
    return str(SHM_DIR / name.lstrip("/"))


def _connected(name: str, conn: Any) -> None:
    """In a child process: connect, say the slot, stay until told to go."""
    with connect(name, timeout=30) as client:
        conn.send(client.index)  # type: ignore[attr-defined]
        conn.recv()


def _maps(pid: int) -> dict[str, set[str]]:
    """The /dev/shm files process ``pid`` maps, each with the permissions it has them."""
    found: dict[str, set[str]] = {}
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and parts[5].startswith(str(SHM_DIR)):
                found.setdefault(parts[5], set()).add(parts[1])
    return found


def test_a_client_maps_its_own_mailbox_and_the_control_read_only(daemon: DaemonProcess) -> None:
    names = DaemonNames(daemon.name)
    fork = multiprocessing.get_context("fork")  # (this process maps nothing of the daemon)
    parent, child = fork.Pipe()
    process = fork.Process(target=_connected, args=(daemon.name, child))
    process.start()
    try:
        assert parent.poll(30)
        index = parent.recv()
        assert process.pid is not None
        maps = _maps(process.pid)
        parent.send("go")
    finally:
        process.join(30)
    assert process.exitcode == 0
    assert maps[_file(names.control)] == {"r--s"}  # the daemon block, the roster
    assert maps[_file(names.claims)] == {"rw-s"}
    assert maps[_file(names.mailbox(index))] == {"rw-s"}
    others = [n for i in range(3) if i != index for n in (names.mailbox(i), names.client_inputs(i))]
    assert not {_file(n) for n in others} & set(maps), maps


def _write_the_state_word(name: str) -> None:
    """In a child: a client's view of the control segment, and a store into it."""
    faulthandler.disable()  # the crash is the point: no traceback for it
    segment = Segment.open(DaemonNames(name).control, kind=KIND_CONTROL, readonly=True)
    lib.shm_store_release(segment.word(HEADER_SIZE), 2)  # the kernel refuses: SIGSEGV


def test_the_daemon_block_cannot_be_written_from_a_clients_mapping(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as client:
        block = client.transport.slot.segment.bytes_at(HEADER_SIZE, 8)
        with pytest.raises(TypeError):
            block[0] = 2
        fork = multiprocessing.get_context("fork")
        writer = fork.Process(target=_write_the_state_word, args=(daemon.name,))
        writer.start()
        writer.join(30)
        assert writer.exitcode == -11  # SIGSEGV: the page is mapped read-only
        assert client.transport.control.state is DaemonState.READY
        client.attach("a")
        assert take(client, "a", 3)


def test_a_client_scribbling_all_it_maps_writable_leaves_a_bystander_whole(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as bystander:
        bystander.attach("steady")
        before = [c.chunk for c in take(bystander, "steady", 5)]
        raw = RawClient(daemon.name)
        names = DaemonNames(daemon.name)
        control = Control(Segment.open(names.control, kind=KIND_CONTROL, readonly=True))
        wait_for(lambda: control.table.state(raw.index).name == "ACTIVE", what="the adoption")
        inputs = Segment.open(names.client_inputs(raw.index))  # its own input slots
        for segment in [inputs, *raw.writable]:  # garbage over all of it but the header
            size = segment.size - HEADER_SIZE
            segment.bytes_at(HEADER_SIZE, size)[:] = os.urandom(size)
        lib.shm_store_release(raw.claims_segment.word(HEADER_SIZE), 1 << 40)  # "claims"
        raw.bell.ring()
        after = [c.chunk for c in take(bystander, "steady", 30)]
        stream = before + after
        assert stream == list(range(stream[0], stream[0] + len(stream)))  # no gap, no repeat
        wait_for(lambda: control.table.state(raw.index).name == "FREE", what="the reap")
        for segment in (inputs, *raw.writable, raw.segment):
            segment.close()
        raw.bell.close()
        with connect(daemon.name, timeout=30) as again:  # every slot is claimable again
            again.attach("after")
            assert take(again, "after", 3)
        assert take(bystander, "steady", 1)[0].chunk > stream[-1]
        control.segment.close()
