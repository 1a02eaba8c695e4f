"""Large inputs through each client's own input segment: the same generation and
quota rules as outputs, what goes back when, every wrong reference or loan a
clear error for its sender alone, and no client able to reach another's frames.
(That a frame reaches the engine, on every client form, is test_client.py's.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from daemon_harness import DaemonProcess, Deadline, mapped_file, take, wait_for

from rte.cli.inspect import render
from rte.client import RequestError, RequestTimeout, ShmClient, connect
from rte.contract import Action, NoticeKind
from rte.errors import WireError
from rte.ipc.inspect import snapshot
from rte.protocol.control import KIND_INPUTS
from rte.protocol.inputs import OWNER, conditioning_of
from rte.protocol.names import DaemonNames
from rte.protocol.requests import Act
from rte.protocol.values import InputRef
from shm import Segment, Slab, SlotState
from shm.names import SHM_DIR
from shm.segment import HEADER_SIZE

FRAME = (512, 512, 3)  # for the reference model's 64x64 output: k = 8
CLIENTS = 3


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    d = DaemonProcess(f"{shm_prefix}d", *("--max-sessions", "4", "--max-clients", str(CLIENTS)))
    yield d
    assert d.stop() == 0, d.stderr


class InputSegments:
    """Every client's input segment of a daemon, as an inspector sees them."""

    def __init__(self, name: str) -> None:
        self.names = DaemonNames(name)
        self._open: dict[int, Slab] = {}

    def of(self, index: int) -> Slab:
        """Client slot ``index``'s input slab."""
        if index not in self._open:
            segment = Segment.open(self.names.client_inputs(index), kind=KIND_INPUTS, readonly=True)
            self._open[index] = Slab(segment, HEADER_SIZE)
        return self._open[index]

    def close(self) -> None:
        for slab in self._open.values():
            slab.segment.close()


@pytest.fixture
def inputs(daemon: DaemonProcess) -> Iterator[InputSegments]:
    daemon.client().close()  # it is up
    segments = InputSegments(daemon.name)
    yield segments
    segments.close()


def held_until(slab: Slab, count: int) -> None:
    limit = Deadline(what=f"{slab.segment.name} holding {count} input slots")
    while slab.held(OWNER) != count:
        limit.check(slab.held(OWNER))


def errors(client: ShmClient, n: int) -> list[str]:
    found: list[str] = []
    limit = Deadline(what=f"{n} error notices")
    while len(found) < n:
        limit.check(found)
        take(client, "a", 1)
        found += [x.message for x in client.notices() if x.kind is NoticeKind.ERROR]
    return found


def test_a_frame_per_step_holds_a_bounded_number_of_slots_all_back_after(
    daemon: DaemonProcess, inputs: InputSegments
) -> None:
    """Each frame replaces the last; a replaced one goes back a step later. So a
    client sending a frame with every action never runs out of its quota (4)."""
    with daemon.client() as client:
        mine = inputs.of(client.index)
        client.attach("a", credits=1)
        for i in range(40):
            client.act("a", {"frame": np.full(FRAME, i, np.uint8)})
            take(client, "a", 1)
            assert mine.held(OWNER) <= mine.quota
        assert mine.held(OWNER) >= 1  # the current frame: the engine reads it
        client.act("a", {"move": (0, 1), "frame": np.zeros((64, 64, 3), np.uint8)})  # inline
        take(client, "a", 3)
        held_until(mine, 0)  # replaced by an inline frame: nothing held
        client.act("a", {"frame": np.full(FRAME, 9, np.uint8)})
        take(client, "a", 2)
        client.detach("a")
        held_until(mine, 0)
        assert mine.statistics().held == 0


def test_loans_are_bounded_by_the_quota_and_come_back_unsent(
    daemon: DaemonProcess, inputs: InputSegments
) -> None:
    with daemon.client() as client:
        mine = inputs.of(client.index)
        loans = [client.loan(FRAME, "uint8") for _ in range(mine.quota)]
        snap = snapshot(daemon.name)  # rte inspect shows who holds input slots
        assert snap["inputs"]["held_by_client"] == {str(client.index): mine.quota}
        assert snap["inputs"]["segments"] == CLIENTS  # one per client slot
        assert snap["inputs"]["clients"][str(client.index)]["held"] == mine.quota
        total = CLIENTS * mine.slots
        assert f"inputs  {total} slots of 1,048,576 B" in render(snap)
        assert f"(a segment per client: {CLIENTS})" in render(snap)
        with pytest.raises(RequestTimeout, match=f"holds its quota of {mine.quota}"):
            client.loan(FRAME, "uint8", timeout=0.2)
        with pytest.raises(RequestTimeout, match="no input slot"):  # by value, the same rule
            client.attach("a", {"frame": np.zeros(FRAME, np.uint8)}, timeout=0.2)
        assert client.sessions == set()
        for loan in loans:
            loan.abort()
        held_until(mine, 0)
        with client.loan(FRAME, "uint8") as frame:
            frame[...] = 7
            client.attach("a", {"frame": frame})
        assert client.sessions == {"a"}


def test_stale_foreign_and_unreadable_references_are_their_senders_error(
    daemon: DaemonProcess, inputs: InputSegments
) -> None:
    """A reference names a slot of its sender's own input segment: another
    client's reference (forged, or stolen off its ring) names nothing the thief
    published, and is refused without a touch to the owner's slot."""
    owner, thief = daemon.client(), daemon.client()
    try:
        owner.attach("mine")
        thief.attach("a")
        loan = owner.loan(FRAME, "uint8")
        lent = owner.transport.lend(Act("mine", Action({"frame": loan.array}), 999), 1.0)
        ref = loan_ref = conditioning_of(lent)["frame"]  # published, never sent
        assert isinstance(loan_ref, InputRef)
        forged = [
            InputRef(ref.slot, ref.generation, "|u1", FRAME),  # another client's slot
            InputRef(ref.slot, ref.generation + 1, "|u1", FRAME),  # a generation never made
            InputRef(10_000, 1, "|u1", FRAME),  # no such slot
            InputRef(ref.slot, ref.generation, "|u1", (4096, 4096, 3)),  # larger than a slot
        ]
        for n, bad in enumerate(forged, 1):
            thief.transport.send(Act("a", Action({"frame": bad}), 1000 + n), 1.0)
        said = errors(thief, len(forged))
        published = "frame: not a slot this client published in its input segment"
        assert sum(published in e for e in said) == len(forged), said
        owners = inputs.of(owner.index)
        assert owners.slot(ref.slot).state is SlotState.READY  # the owner's slot, untouched
        assert inputs.of(thief.index).statistics().held == 0  # nothing taken in the thief's
        assert take(thief, "a", 2)  # the thief streams on; so does everyone
        assert take(owner, "mine", 2)
    finally:
        thief.close()
        owner.close()
    held_until(owners, 0)  # sent nowhere, still reclaimed when it left


def test_a_killed_client_s_input_segment_is_reset_for_the_slot_s_next_client(
    daemon: DaemonProcess, inputs: InputSegments
) -> None:
    """Its slots come back, and its frames are gone: the next client of its slot
    maps the same segment and must read zeros, never the frames of the last."""
    script = textwrap.dedent(
        f"""
        import sys, time
        import numpy as np
        from rte.client import connect
        client = connect({daemon.name!r}, timeout=30)
        client.attach("a")
        client.act("a", {{"frame": np.full({FRAME}, 0xAB, np.uint8)}})
        kept = [client.loan({FRAME}, "uint8") for _ in range(2)]
        for loan in kept:
            loan.array[...] = 0xCD
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
            held_until(inputs.of(index), 3)
            child.kill()
            child.wait(10)
            held_until(inputs.of(index), 0)
            wait_for(lambda: snapshot(daemon.name)["summary"]["clients"] == 0, what="its slot")
        finally:
            child.kill()
    with daemon.client() as again:  # the slot's next client has the whole quota, all zeros
        assert again.index == index
        loans = [again.loan(FRAME, "uint8") for _ in range(inputs.of(index).quota)]
        assert [int(loan.array.max()) for loan in loans] == [0] * len(loans)
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
                with pytest.raises(RequestError, match=match):  # too big for a record too
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
    daemon: DaemonProcess, inputs: InputSegments
) -> None:
    owner, other = daemon.client(), daemon.client()
    try:
        owner.attach("mine")
        other.act("mine", {"frame": np.zeros(FRAME, np.uint8)})  # refused: not its session
        held_until(inputs.of(other.index), 0)
        owner.attach("a", {"frame": np.full(FRAME, 10, np.uint8)})
        owner.attach("a", {"frame": np.full(FRAME, 250, np.uint8)})  # attached already
        held_until(inputs.of(owner.index), 1)  # the first frame, still read; the second back
        assert all(c.latent.mean() < 100 for c in take(owner, "a", 3))
    finally:
        other.close()
        owner.close()


BAD_LOANS = [
    ((-1, 3), "uint8", "negative"),  # was a writable (6291456, 3) array over other slots
    ((3, -1), "uint8", "negative"),
    ((-2, -3), "uint8", "negative"),  # a positive product of negative dims
    ((0, 3), "uint8", "no bytes"),
    ((), "V0", "bool, int, float or complex"),
    ((2**62, 2**62), "uint8", "exceeds the input slots"),  # overflows int64
    ((2**40,), "uint64", "exceeds the input slots"),  # huge
    ((1025, 1024), "uint8", "exceeds the input slots"),  # one row more than a slot
    ((True, 3), "uint8", "tuple of ints"),
    ((1.5, 3), "uint8", "tuple of ints"),
    (("512", 3), "uint8", "tuple of ints"),
    ((1,) * 9, "uint8", "at most 8"),
    ((16,), "object", "bool, int, float or complex"),  # pointers in shared memory
    ((16,), [("a", "u1")], "bool, int, float or complex"),
    ((16,), "not-a-dtype", "not a NumPy dtype"),
]


def test_a_loan_of_a_shape_or_dtype_that_cannot_be_lent_is_refused_and_takes_nothing(
    daemon: DaemonProcess, inputs: InputSegments
) -> None:
    """Every shape and dtype is checked before a slot is taken or a byte mapped: a
    RequestError that names what was asked; the client's quota stays whole."""
    with daemon.client() as client:
        mine = inputs.of(client.index)
        for shape, dtype, match in BAD_LOANS:
            with pytest.raises(RequestError, match=match):
                client.loan(shape, dtype, timeout=0.0)
        assert mine.held(OWNER) == 0
        assert mine.statistics().acquired == 0  # not even taken and given back
        loans = [client.loan(FRAME, "uint8") for _ in range(mine.quota)]  # all still there
        assert loans[0].array.shape == FRAME
        for loan in loans:
            loan.abort()


@pytest.mark.parametrize("shape", [(-1, 3), (0,), (True,)])
def test_an_in_process_loan_is_checked_as_a_daemon_s(shape: tuple[int, ...]) -> None:
    with connect() as client, pytest.raises(RequestError, match="a loan of shape"):
        client.loan(shape, "uint8")


def test_each_client_maps_its_own_input_segment_and_no_other(
    daemon: DaemonProcess, inputs: InputSegments
) -> None:
    """A loan's every byte lies in its client's own segment, and a client process
    maps no other client's: nothing it does can reach their frames."""
    names = DaemonNames(daemon.name)
    a, b = daemon.client(), daemon.client()
    try:
        for client in (a, b):
            own = str(SHM_DIR / names.client_inputs(client.index).lstrip("/"))
            with client.loan(FRAME, "uint8") as frame:
                first, last = frame.ctypes.data, frame.ctypes.data + frame.nbytes - 1
                assert mapped_file(first) == own and mapped_file(last) == own
        assert a.index != b.index
    finally:
        b.close()
        a.close()
    script = textwrap.dedent(
        f"""
        import sys, numpy as np
        from rte.client import connect
        client = connect({daemon.name!r}, timeout=30)
        with client.loan({FRAME}, "uint8") as frame:
            frame[...] = 1
            client.attach("a", {{"frame": frame}})
        print(client.index, flush=True)
        sys.stdin.readline()
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None and child.stdin is not None
            index = int(child.stdout.readline())
            maps = Path(f"/proc/{child.pid}/maps").read_text()
            inputs_of = {names.client_inputs(i).lstrip("/") for i in range(CLIENTS)}
            mapped = {name for name in inputs_of if name in maps}
            assert mapped == {names.client_inputs(index).lstrip("/")}, mapped
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.wait(30) == 0
        finally:
            child.kill()
