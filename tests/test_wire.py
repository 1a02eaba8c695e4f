"""The wire format: round trips, and hostile bytes give WireError, never a crash."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rte.conditioning import conditioning_equal
from rte.wire import (
    ChunkRef,
    RecordType,
    WireError,
    decode,
    decode_value,
    encode,
    encode_chunk,
    encode_value,
)

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


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_decode_or_raise_wire_error(data: bytes) -> None:
    for decoder in (decode, decode_value):
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


def test_records_round_trip() -> None:
    record = decode(encode(RecordType.ACT, "s1", 7, body=encode_value({"move": (1, 2)})))
    assert (record.type, record.session, record.seq, record.value) == (
        RecordType.ACT,
        "s1",
        7,
        {"move": (1, 2)},
    )
    ref = ChunkRef(5, 3, 9, "uint8", (64, 64, 3), 10, 20)
    assert decode(encode_chunk("s1", ref)).chunk == ref
    assert decode(encode(RecordType.RESET, "s")).value is None
    assert decode(encode(RecordType.ATTACH, "s")).value == {}


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "shorter than a header"),
        (bytes([99, 0, 0, 0, 0, 0, 0, 0]), "unknown record type 99"),
        (bytes([1, 0, 50, 0, 0, 0, 0, 0]) + b"abc", "runs past the end"),
        (encode(RecordType.ATTACH, "s", body=encode_value([1])), "must be a mapping"),
        (encode(RecordType.DETACH, "s", body=b"xx"), "takes no body"),
    ],
)
def test_malformed_records_say_what_is_wrong(data: bytes, match: str) -> None:
    with pytest.raises(WireError, match=match):
        decode(data)


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
