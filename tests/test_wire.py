"""The wire format: round trips, and hostile bytes give WireError, never a crash."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rte import Act, Action, Attach, Detach, Notice, NoticeKind, Reset
from rte.conditioning import conditioning_equal
from rte.errors import WireError
from rte.ipc.values import decode_value, encode_value
from rte.ipc.wire import (
    HEADER,
    MAX_SESSION_BYTES,
    Bye,
    ChunkEncoder,
    ChunkRef,
    RecordType,
    decode_reply,
    decode_request,
    describe,
    encode_notice,
    encode_request,
    request_seq,
)
from shm import SlotRef


def raw(kind: int, session: str, body: bytes = b"", seq: int = 0) -> bytes:
    name = session.encode()
    return HEADER.pack(kind, 0, len(name), seq) + name + body


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    hnp.arrays(
        st.sampled_from(["uint8", "int32", "float32", "float64", "bool", "complex64"]),
        hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    ),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(values)
def test_values_round_trip_exactly(value: object) -> None:
    back = decode_value(encode_value(value))
    if isinstance(value, np.ndarray):
        assert back.dtype == value.dtype and back.shape == value.shape
        np.testing.assert_array_equal(back, value)
    else:
        assert conditioning_equal(back, value)


array_headers = st.builds(  # arrays whose shapes hold few bytes but absurd sides
    lambda dims: (
        bytes([10, 3])
        + b"<f4"
        + bytes([len(dims)])
        + b"".join(d.to_bytes(8, "little") for d in dims)
    ),
    st.lists(st.sampled_from([0, 1, 2, 2**31, 2**32 + 1, 2**63, 2**64 - 1]), max_size=4),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), array_headers))
def test_random_bytes_decode_or_raise_wire_error(data: bytes) -> None:
    for decoder in (decode_request, decode_reply, decode_value):
        with contextlib.suppress(WireError):
            decoder(data)


@settings(max_examples=200, deadline=None)
@given(values, st.data())
def test_truncated_or_flipped_values_never_crash(value: object, data: st.DataObject) -> None:
    raw = bytearray(encode_value({"k": value}))
    cut = data.draw(st.integers(0, len(raw)))
    flip = data.draw(st.integers(0, len(raw) - 1))
    raw[flip] ^= data.draw(st.integers(1, 255))
    for candidate in (bytes(raw[:cut]), bytes(raw)):
        with contextlib.suppress(WireError):
            decode_value(candidate)


def test_requests_round_trip() -> None:
    for request in (
        Attach("s1", {"prompt": "p"}, 3),
        Act("s1", Action({"move": (1, 2)}), 7),
        Detach("s1", seq=8),
        Reset("s1", None, 9),
        Reset("s1", {"prompt": "q"}, 10),
        Bye(),
    ):
        assert decode_request(encode_request(request)) == request
    assert request_seq(encode_request(Detach("s", seq=12))) == 12
    assert request_seq(b"\x01") == 0


def test_replies_round_trip_and_notice_kinds_are_one_to_one() -> None:
    for kind in NoticeKind:  # DROPPED stays DROPPED
        notice = Notice("s", kind, f"{kind.name} happened", 4)
        assert decode_reply(encode_notice(notice, 4096)) == notice
    ref = ChunkRef("s1", 5, 3, 9, "uint8", (64, 64, 3), 10, 20)
    record = ChunkEncoder("uint8", (64, 64, 3))("s1", 5, SlotRef(3, 9, 0), 10, 20)
    assert decode_reply(record) == ref
    assert "CHUNK 's1' chunk=5 slot=3" in describe(record)
    assert "undecodable" in describe(b"\xff")


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


def test_a_session_id_too_long_to_answer_is_refused_before_it_is_sent() -> None:
    with pytest.raises(WireError, match="longer than"):
        encode_request(Detach("s" * (MAX_SESSION_BYTES + 1)))
    with pytest.raises(WireError, match="longer than"):
        decode_request(raw(RecordType.DETACH, "s" * (MAX_SESSION_BYTES + 1)))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "shorter than a header"),
        (bytes([99, 0, 0, 0, 0, 0, 0, 0]), "unknown record type 99"),
        (bytes([1, 0, 50, 0, 0, 0, 0, 0]) + b"abc", "runs past the end"),
        (raw(RecordType.ATTACH, "s", encode_value([1])), "must be a mapping"),
        (raw(RecordType.DETACH, "s", b"xx"), "takes no body"),
        (raw(RecordType.CHUNK, "s"), "cannot send CHUNK"),
    ],
)
def test_malformed_records_say_what_is_wrong(data: bytes, match: str) -> None:
    with pytest.raises(WireError, match=match):
        decode_request(data)


def test_hostile_values_are_bounded() -> None:
    with pytest.raises(WireError, match="claims"):
        decode_value(bytes([7]) + (2**32 - 1).to_bytes(4, "little"))  # a list of 4 billion
    with pytest.raises(WireError, match="deeper"):
        decode_value(bytes([7, 1, 0, 0, 0]) * 40 + bytes([0]))
    object_array = bytes([10, 3]) + b"|O8" + bytes([1]) + (1).to_bytes(8, "little") + bytes(8)
    with pytest.raises(WireError, match="not allowed"):
        decode_value(object_array)
    with pytest.raises(WireError, match="cannot send"):
        encode_value({"f": object()})
    with pytest.raises(WireError, match="cannot be sent"):
        encode_value(np.array([object()]))


def test_an_array_with_a_zero_side_and_an_absurd_one_is_refused() -> None:
    # no bytes to read, but no array NumPy can make either: a WireError, not a ValueError
    header = bytes([10, 3]) + b"<f4" + bytes([2])
    raw = header + (0).to_bytes(8, "little") + (2**63).to_bytes(8, "little")
    with pytest.raises(WireError, match="no array of shape"):
        decode_value(raw)
