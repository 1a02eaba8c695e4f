"""Large inputs through the daemon's input slab: the same ownership, generation
and quota rules as outputs, what goes back when, and every wrong reference a
clear error for its sender alone. (That a frame reaches the engine, on every
client form, is test_client.py's.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest
from daemon_harness import DaemonProcess, Deadline, take

from rte.cli.inspect import render
from rte.client import RequestError, RequestTimeout, ShmClient
from rte.contract import Action, NoticeKind
from rte.errors import WireError
from rte.ipc.control import KIND_INPUTS
from rte.ipc.inspect import snapshot
from rte.ipc.names import DaemonNames
from rte.ipc.values import InputRef
from rte.serve import Act
from shm import Segment, Slab, SlotState
from shm.segment import HEADER_SIZE

FRAME = (512, 512, 3)  # for the reference model's 64x64 output: k = 8
CLIENTS = 3


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    d = DaemonProcess(f"{shm_prefix}d", *("--max-sessions", "4", "--max-clients", str(CLIENTS)))
    yield d
    assert d.stop() == 0, d.stderr


@pytest.fixture
def inputs(daemon: DaemonProcess) -> Iterator[Slab]:
    """The daemon's input slab, as an inspector sees it."""
    daemon.client().close()  # it is up
    segment = Segment.open(DaemonNames(daemon.name).inputs, kind=KIND_INPUTS, readonly=True)
    yield Slab(segment, HEADER_SIZE)
    segment.close()


def held_until(slab: Slab, owner: int, count: int) -> None:
    limit = Deadline(what=f"owner {owner} holding {count} input slots")
    while slab.held(owner) != count:
        limit.check(slab.held(owner))


def errors(client: ShmClient, n: int) -> list[str]:
    found: list[str] = []
    limit = Deadline(what=f"{n} error notices")
    while len(found) < n:
        limit.check(found)
        take(client, "a", 1)
        found += [x.message for x in client.notices() if x.kind is NoticeKind.ERROR]
    return found


def test_a_frame_per_step_holds_a_bounded_number_of_slots_all_back_after(
    daemon: DaemonProcess, inputs: Slab
) -> None:
    """Each frame replaces the last; a replaced one goes back a step later. So a
    client sending a frame with every action never runs out of its quota (4)."""
    with daemon.client() as client:
        client.attach("a", credits=1)
        for i in range(40):
            client.act("a", {"frame": np.full(FRAME, i, np.uint8)})
            take(client, "a", 1)
            assert inputs.held(client.index) <= inputs.quota
        assert inputs.held(client.index) >= 1  # the current frame: the engine reads it
        client.act("a", {"move": (0, 1), "frame": np.zeros((64, 64, 3), np.uint8)})  # inline
        take(client, "a", 3)
        held_until(inputs, client.index, 0)  # replaced by an inline frame: nothing held
        client.act("a", {"frame": np.full(FRAME, 9, np.uint8)})
        take(client, "a", 2)
        client.detach("a")
        held_until(inputs, client.index, 0)
        assert inputs.statistics().held == 0


def test_loans_are_bounded_by_the_quota_and_come_back_unsent(
    daemon: DaemonProcess, inputs: Slab
) -> None:
    with daemon.client() as client:
        loans = [client.loan(FRAME, "uint8") for _ in range(inputs.quota)]
        snap = snapshot(daemon.name)  # rte inspect shows who holds input slots
        assert snap["inputs"]["held_by_client"] == {str(client.index): inputs.quota}
        assert f"inputs  {inputs.slots} slots of 1,048,576 B" in render(snap)
        with pytest.raises(RequestTimeout, match=f"holds its quota of {inputs.quota}"):
            client.loan(FRAME, "uint8", timeout=0.2)
        with pytest.raises(RequestTimeout, match="no input slot"):  # by value, the same rule
            client.attach("a", {"frame": np.zeros(FRAME, np.uint8)}, timeout=0.2)
        assert client.sessions == set()
        for loan in loans:
            loan.abort()
        held_until(inputs, client.index, 0)
        with client.loan(FRAME, "uint8") as frame:
            frame[...] = 7
            client.attach("a", {"frame": frame})
        assert client.sessions == {"a"}


def test_stale_foreign_and_unreadable_references_are_their_senders_error(
    daemon: DaemonProcess, inputs: Slab
) -> None:
    owner, thief = daemon.client(), daemon.client()
    try:
        owner.attach("mine")
        thief.attach("a")
        loan = owner.loan(FRAME, "uint8")
        ref = loan_ref = owner._lender.lend({"frame": loan.array}, 1.0)[0]["frame"]
        assert isinstance(loan_ref, InputRef)
        forged = [
            InputRef(ref.slot, ref.generation, "|u1", FRAME),  # another client's slot
            InputRef(ref.slot, ref.generation + 1, "|u1", FRAME),  # a generation never made
            InputRef(10_000, 1, "|u1", FRAME),  # no such slot
            InputRef(ref.slot, ref.generation, "|u1", (4096, 4096, 3)),  # larger than a slot
        ]
        for n, bad in enumerate(forged, 1):
            thief._send(Act("a", Action({"frame": bad}), 1000 + n), 1.0)
        said = errors(thief, len(forged))
        assert any("is not this client's" in e for e in said), said
        assert sum("frame:" in e for e in said) == len(forged), said
        assert inputs.slot(ref.slot).state is SlotState.READY  # the owner's slot, untouched
        assert inputs.slot(ref.slot).owner == owner.index
        assert take(thief, "a", 2)  # the thief streams on; so does everyone
        assert take(owner, "mine", 2)
    finally:
        thief.close()
        owner.close()
    held_until(inputs, owner.index, 0)  # sent nowhere, still reclaimed when it left


def test_a_killed_client_s_input_slots_are_reclaimed(daemon: DaemonProcess, inputs: Slab) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        import numpy as np
        from rte.client import connect
        client = connect({daemon.name!r}, timeout=30)
        client.attach("a")
        client.act("a", {{"frame": np.ones({FRAME}, np.uint8)}})
        kept = [client.loan({FRAME}, "uint8") for _ in range(2)]
        print(client.index, flush=True)
        time.sleep(60)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            index = int(child.stdout.readline())
            held_until(inputs, index, 3)
            child.kill()
            child.wait(10)
            held_until(inputs, index, 0)
        finally:
            child.kill()
    with daemon.client() as again:  # the slot's next client has the whole quota
        loans = [again.loan(FRAME, "uint8") for _ in range(inputs.quota)]
        for loan in loans:
            loan.abort()


def test_a_daemon_without_inputs_or_with_small_slots_says_how_to_start_it(
    shm_prefix: str,
) -> None:
    for args, match in (
        (("--input-slots", "0"), "takes no inputs by slot: start it with --input-slots"),
        (("--input-slot-kib", "64"), "start it with --input-slot-kib 768"),
    ):
        d = DaemonProcess(f"{shm_prefix}{args[0][2:]}", "--max-sessions", "2", *args)
        try:
            with d.client() as client:
                with pytest.raises(WireError, match=match):
                    client.loan(FRAME, "uint8")
                client.attach("a")
                with pytest.raises(RequestError):  # too big for a record and for a slot
                    client.act("a", {"frame": np.zeros(FRAME, np.uint8)})
                assert take(client, "a", 1)
        finally:
            assert d.stop() == 0, d.stderr


def test_a_replaced_frame_stays_held_until_its_own_session_steps(shm_prefix: str) -> None:
    """Session "a" holds its chunk (credit 1: not due) while "b" steps on. "a"'s
    next chunk was made with its old frame and decodes from it when "a" is due
    again: the old frame's slot must not go back while "b" steps (it did: a loan
    got it and scribbled on "a"'s next chunk)."""
    d = DaemonProcess(
        f"{shm_prefix}r", *("--max-sessions", "2", "--max-clients", "1", "--input-slots", "2")
    )
    try:
        with d.client() as client:
            client.attach("a", credits=1)
            client.attach("b", credits=1)
            with client.loan(FRAME, "uint8") as first:
                first[...] = 10
                client.act("a", {"frame": first})
            held = None
            limit = Deadline(what="a chunk of a with its frame, held")
            while held is None:
                limit.check()
                chunk = client.poll(timeout=1.0)
                if chunk is None:
                    continue
                if chunk.session == "a" and chunk.latent.mean() < 100:
                    held = chunk  # not released: "a" is not due from now on
                else:
                    chunk.release()
            with client.loan(FRAME, "uint8") as second:
                second[...] = 10
                client.act("a", {"frame": second})  # the first frame retires
            take(client, "b", 5)  # "b" steps on: five steps without "a"
            with pytest.raises(RequestTimeout):  # the first frame's slot is still "a"'s
                client.loan(FRAME, "uint8", timeout=0.3)
            held.release()
            after = take(client, "a", 2)  # "a" steps: its old batch decoded, the slot freed
            assert all(c.latent.mean() < 100 for c in after)
            with client.loan(FRAME, "uint8", timeout=5):
                pass
    finally:
        assert d.stop() == 0, d.stderr


def test_refused_and_ignored_requests_give_their_slots_back(
    daemon: DaemonProcess, inputs: Slab
) -> None:
    owner, other = daemon.client(), daemon.client()
    try:
        owner.attach("mine")
        other.act("mine", {"frame": np.zeros(FRAME, np.uint8)})  # refused: not its session
        held_until(inputs, other.index, 0)
        owner.attach("a", {"frame": np.full(FRAME, 10, np.uint8)})
        owner.attach("a", {"frame": np.full(FRAME, 250, np.uint8)})  # attached already
        held_until(inputs, owner.index, 1)  # the first frame, still read; the second back
        assert all(c.latent.mean() < 100 for c in take(owner, "a", 3))
    finally:
        other.close()
        owner.close()
