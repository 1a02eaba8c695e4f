"""The wire format: round trips, and hostile bytes give WireError, never a crash."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rte import Act, Action, Attach, Detach, Notice, NoticeKind, Reset
from rte.errors import WireError
from rte.protocol.requests import Resume, Suspend
from rte.protocol.steps import NOT_JUDGED, push_step, step_reader
from rte.protocol.values import encode_value
from rte.protocol.wire import (
    HEADER,
    MAX_SESSION_BYTES,
    Bye,
    RecordType,
    StepColumns,
    decode_reply,
    decode_request,
    describe,
    encode_notice,
    encode_request,
    encode_step,
    reply_handle,
    request_seq,
    stamp_pushed,
)
from shm import Ring, Segment, Slab
from shm.segment import HEADER_SIZE

StepMaker = Callable[..., bytearray]


def raw(kind: int, session: str, body: bytes = b"", seq: int = 0) -> bytes:
    name = session.encode()
    return HEADER.pack(kind, 0, len(name), seq, 0) + name + body


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_decode_or_raise_wire_error(data: bytes) -> None:
    for decoder in (decode_request, decode_reply):
        with contextlib.suppress(WireError):
            decoder(data)


def test_requests_round_trip() -> None:
    for request in (
        Attach("s1", {"prompt": "p"}, 3),
        Attach("s1", {}, 4, credits=7),
        Act("s1", Action({"move": (1, 2)}), 7),
        Detach("s1", seq=8),
        Reset("s1", None, 9),
        Reset("s1", {"prompt": "q"}, 10),
        Suspend("s1", 11),
        Resume("s1", 12),
        Bye(),
    ):
        assert decode_request(encode_request(request)) == request
    assert request_seq(encode_request(Detach("s", seq=12))) == 12
    assert request_seq(b"\x01") == 0


@pytest.fixture(params=["python", "c"])
def step_record(request: pytest.FixtureRequest, shm_prefix: str) -> Iterator[StepMaker]:
    """Makes a STEP record as the Python encodes it, or as the C writes it into a ring."""
    if request.param == "python":
        yield encode_step
        return
    segment = Segment.create(f"{shm_prefix}wire", HEADER_SIZE + Ring.footprint(1 << 12))
    try:
        ring = Ring.create(segment, HEADER_SIZE, 1 << 12, policy="spin")

        def in_place(*args: Any, **kwargs: Any) -> bytearray:
            assert push_step(ring, *args, **kwargs)
            return bytearray(ring.pop_nowait())

        yield in_place
    finally:
        segment.close()
        segment.unlink()


def test_replies_round_trip_and_notice_kinds_are_one_to_one(step_record: StepMaker) -> None:
    for kind in NoticeKind:  # DROPPED stays DROPPED
        notice = Notice("s", kind, f"{kind.name} happened", 4)
        assert decode_reply(encode_notice(notice, 4096)) == notice
    attached = encode_notice(Notice("s", NoticeKind.ATTACHED, "", 4), 4096, handle=9)
    assert reply_handle(attached) == 9
    slots, generations = np.array([3, 4], np.uint64), np.array([9, 1], np.uint64)
    record = step_record(slots, generations, [5, 6], 10, [2, 0], contiguous=True, emitted_ns=20)
    stamp_pushed(record, 30)
    step = decode_reply(bytes(record))
    assert isinstance(step, StepColumns) and step.contiguous
    assert (step.emitted_ns, step.pushed_ns) == (20, 30)
    assert step.slots.tolist() == [3, 4] and step.generations.tolist() == [9, 1]
    assert step.chunks.tolist() == [5, 6] and step.generated_ns.tolist() == [10, 10]
    assert step.handles == [2, 0]
    assert np.asarray(step.slots).ctypes.data % 8 == 0  # the C reads the columns in place
    assert "STEP 2 chunks, handles=[2, 0]" in describe(bytes(record))
    assert "undecodable" in describe(b"\xff")


@pytest.mark.parametrize("cut", [1, 8, 40, 41])
def test_a_step_record_that_lies_about_its_size_is_refused(
    cut: int, step_record: StepMaker
) -> None:
    one = np.array([1], np.uint64)
    record = bytes(step_record(one, one, [0], 0, [0], contiguous=True, emitted_ns=0))
    with pytest.raises(WireError):
        decode_reply(record[:-cut] if cut < len(record) else record[: HEADER.size])
    with pytest.raises(WireError, match="does not match"):
        decode_reply(record + b"\0" * 8)


def test_an_answer_that_would_not_fit_is_cut_and_says_so() -> None:
    notice = Notice("s", NoticeKind.ERROR, "x" * 100_000, 5)
    record = encode_notice(notice, 1024)
    assert len(record) <= 1024
    back = decode_reply(record)
    assert isinstance(back, Notice) and back.seq == 5 and back.session == "s"
    assert back.message.endswith("[truncated]")
    huge = Notice("é" * 40_000, NoticeKind.ERROR, "ü" * 10_000, 6)  # cut inside a character
    back = decode_reply(encode_notice(huge, 2048))
    assert isinstance(back, Notice) and back.seq == 6 and back.session == ""


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (Attach("s", {}, 1, credits=1.5), "credits must be a whole number"),  # was struct.error
        (Attach("s", {}, 1, credits=True), "credits must be a whole number"),
        (Attach("s", {}, 1, credits=-1), "credits -1: must be 1 to 255"),
        (Attach("s", {}, 1, credits=10**30), "must be 1 to 255"),
        (Attach("x\ud800"), "not valid UTF-8"),  # was UnicodeEncodeError
        (Act(5, Action({})), "a session id is a str, not int"),  # type: ignore[arg-type]
        (Detach(None), "a session id is a str, not NoneType"),  # type: ignore[arg-type]
    ],
)
def test_what_a_record_cannot_carry_is_a_wire_error(request_: object, match: str) -> None:
    with pytest.raises(WireError, match=match):
        encode_request(request_)  # type: ignore[arg-type]


def test_a_session_id_too_long_to_answer_is_refused_before_it_is_sent() -> None:
    with pytest.raises(WireError, match="longer than"):
        encode_request(Detach("s" * (MAX_SESSION_BYTES + 1)))
    with pytest.raises(WireError, match="longer than"):
        decode_request(raw(RecordType.DETACH, "s" * (MAX_SESSION_BYTES + 1)))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "shorter than a header"),
        (bytes([99] + [0] * 11), "unknown record type 99"),
        (bytes([1, 0, 50] + [0] * 9) + b"abc", "runs past the end"),
        (raw(RecordType.ATTACH, "s", encode_value([1])), "must be a mapping"),
        (raw(RecordType.DETACH, "s", b"xx"), "takes no body"),
        (raw(RecordType.STEP, "s"), "cannot send STEP"),
    ],
)
def test_malformed_records_say_what_is_wrong(data: bytes, match: str) -> None:
    with pytest.raises(WireError, match=match):
        decode_request(data)


@pytest.mark.parametrize("cut", [1, 8, 40, 41])
def test_the_c_reader_leaves_each_step_that_lies_to_the_reference(
    cut: int, step_record: StepMaker, shm_prefix: str
) -> None:
    # the client's C path (step_reader) judges a record ready only when the Python
    # decoder would read it: a record that lies is handed on to be refused as above
    ring_bytes = Ring.footprint(1 << 12)
    size = HEADER_SIZE + ring_bytes + Slab.footprint(HEADER_SIZE + ring_bytes, 4, 64, 1)
    segment = Segment.create(f"{shm_prefix}reader", size)
    try:
        ring = Ring.create(segment, HEADER_SIZE, 1 << 12, policy="spin")
        slab = Slab.create(
            segment, HEADER_SIZE + ring_bytes, slots=4, slot_bytes=64, max_owners=1, quota=4
        )
        loan = slab.loan_batch(0, 2, "u1", (4,))
        loan.publish()
        record = bytes(
            step_record(
                loan.slots, loan.generations, [0, 1], 0, [0, 1], contiguous=True, emitted_ns=0
            )
        )
        lies = [record[:-cut] if cut < len(record) else record[: HEADER.size], record + b"\0" * 8]
        for one in (*lies, record):
            ring.push_nowait(one)
        verdicts = [(raw, first) for raw, first in step_reader(ring, slab, 2).pop()]
        assert verdicts == [(lies[0], NOT_JUDGED), (lies[1], NOT_JUDGED), (record, loan.slots[0])]
        assert step_reader(ring, slab, 1).pop() == []  # (empty)
        ring.push_nowait(record)
        assert step_reader(ring, slab, 1).pop() == [(record, NOT_JUDGED)]  # handle 1 of 1
    finally:
        segment.close()
        segment.unlink()
