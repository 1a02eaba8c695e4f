"""The conditioning codec: exact round trips (lists arrive as tuples), and what
cannot be sent or was not made by it is a WireError, never a crash."""

from __future__ import annotations

import contextlib
import enum
import struct
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rte.conditioning import conditioning_equal
from rte.errors import WireError
from rte.protocol.values import (
    ARRAY_EXT,
    INPUT_EXT,
    MAX_DEPTH,
    MAX_NDIM,
    InputRef,
    decode_value,
    encode_value,
)

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 63), (1 << 64) - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    hnp.arrays(
        st.sampled_from(
            ["uint8", "int32", ">i8", "float16", "float32", ">f8", "bool", "complex64"]
        ),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
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


def received(value: Any) -> Any:
    """What the codec promises the receiver: every list and tuple as a tuple, all else as sent."""
    if isinstance(value, list | tuple):
        return tuple(received(item) for item in value)
    if isinstance(value, dict):
        return {key: received(item) for key, item in value.items()}
    return value


def exactly(a: Any, b: Any) -> bool:
    """Same structure, same types everywhere (True is not 1), same bits (-0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return bool(
            a.dtype.str == b.dtype.str and a.shape == b.shape and a.tobytes() == b.tobytes()
        )
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(exactly(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(exactly(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return bool(a == b)


def ext(code: int, data: bytes) -> bytes:
    return msgspec.msgpack.encode(msgspec.msgpack.Ext(code, data))


def array_ext(dtype: bytes, shape: tuple[int, ...], raw: bytes, ndim: int | None = None) -> bytes:
    """An array extension as the codec lays it out, free to lie."""
    ndim = len(shape) if ndim is None else ndim
    head = bytes([ndim, len(dtype)]) + dtype + b"".join(d.to_bytes(8, "little") for d in shape)
    return ext(ARRAY_EXT, head + raw)


def nested(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


@settings(max_examples=300, deadline=None)
@given(values)
def test_values_round_trip_exactly(value: object) -> None:
    # exactly as sent, except that a list (as any tuple) arrives as a tuple
    back = decode_value(encode_value(value))
    assert exactly(back, received(value))
    assert conditioning_equal(back, received(value))
    view = decode_value(memoryview(bytearray(encode_value({"k": value}))))  # as the ring gives it
    assert exactly(view, {"k": received(value)})


def test_tuples_and_lists_both_arrive_as_tuples() -> None:
    for sent in ({"move": (0, 1)}, {"move": [0, 1]}):
        back = decode_value(encode_value(sent))
        assert back == {"move": (0, 1)} and type(back["move"]) is tuple
    assert encode_value({"move": (0, 1)}) == encode_value({"move": [0, 1]})
    nested_lists = decode_value(encode_value({"a": [[1, (2,)], [b"x"]], "b": [np.zeros(1)]}))
    assert exactly(nested_lists, received({"a": [[1, (2,)], [b"x"]], "b": [np.zeros(1)]}))


def test_what_is_not_a_mapping_still_decodes_for_the_wire_to_refuse() -> None:
    assert decode_value(encode_value([1])) == (1,)
    assert decode_value(encode_value(None)) is None
    assert decode_value(encode_value("x")) == "x"


def test_numpy_scalars_go_as_plain_numbers() -> None:
    for scalar, plain in (
        (np.int64(-3), -3),
        (np.uint8(200), 200),
        (np.uint64(2**64 - 1), 2**64 - 1),
        (np.float32(1.5), 1.5),
        (np.float64(-0.25), -0.25),
        (np.bool_(True), True),
        (np.bool_(False), False),
    ):
        assert encode_value(scalar) == encode_value(plain)
        assert encode_value({"n": scalar}) == encode_value({"n": plain})
        back = decode_value(encode_value({"n": scalar, "l": [scalar]}))
        assert exactly(back, {"n": plain, "l": (plain,)})


def test_decoded_arrays_are_the_receivers_own_writable_copies() -> None:
    sent = np.arange(12, dtype=">f4").reshape(3, 4)
    ring = bytearray(encode_value({"a": sent, "b": [sent[:, ::2]]}))
    back = decode_value(memoryview(ring))
    for array, expected in ((back["a"], sent), (back["b"][0], sent[:, ::2])):
        assert array.dtype.str == ">f4" and array.shape == expected.shape
        assert array.flags.writeable and array.flags.owndata and array.base is None
        array[0, 0] = 99  # writable indeed
        array[0, 0] = expected[0, 0]
    ring[:] = bytes(len(ring))  # the ring's slot is reused: the arrays do not change
    np.testing.assert_array_equal(back["a"], sent)
    np.testing.assert_array_equal(back["b"][0], sent[:, ::2])
    zero_d = decode_value(encode_value(np.array(7, dtype="<i2")))
    assert zero_d.shape == () and zero_d.dtype.str == "<i2" and zero_d.flags.writeable


array_headers = st.builds(  # array extensions whose headers may lie in every field
    lambda ndim, dtype, dims, raw: array_ext(dtype, tuple(dims), raw, ndim),
    st.one_of(st.none(), st.integers(0, 255)),
    st.sampled_from([b"<f4", b"|b1", b">c16", b"|O8", b"|V8", b"<U2", b"<i3", b"f4", b"", b"\xff"]),
    st.lists(st.sampled_from([0, 1, 2, 3, 2**31, 2**32 + 1, 2**63, 2**64 - 1]), max_size=10),
    st.binary(max_size=40),
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.binary(max_size=200), array_headers, array_headers.map(lambda b: b"\x81\xa1a" + b))
)
def test_random_bytes_decode_or_raise_wire_error(data: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_value(data)


@settings(max_examples=300, deadline=None)
@given(values, st.data())
def test_truncated_or_flipped_values_never_crash(value: object, data: st.DataObject) -> None:
    raw = bytearray(encode_value({"k": value}))
    cut = data.draw(st.integers(0, len(raw)))
    flip = data.draw(st.integers(0, len(raw) - 1))
    raw[flip] ^= data.draw(st.integers(1, 255))
    for candidate in (bytes(raw[:cut]), bytes(raw)):
        with contextlib.suppress(WireError):
            decode_value(candidate)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\xdd\xff\xff\xff\xff", "truncated"),  # a list of 4 billion, in 5 bytes
        (b"\xdf\xff\xff\xff\xff", "truncated"),  # a map of 4 billion
        (b"\xc6\xff\xff\xff\xff", "truncated"),  # 4 GiB of bytes
        (b"\xc9\xff\xff\xff\xff\x01", "truncated"),  # a 4 GiB extension
        (b"", "truncated"),
        (b"\xc1", "not valid msgpack"),
        (b"\xa1\xff", "UTF-8"),
        (encode_value({"a": 1}) + b"\xc0", "trailing"),  # the value must take every byte
        (b"\x91" * (MAX_DEPTH + 1) + b"\xc0", "deeper"),
        (b"\x81\xa1k" * (MAX_DEPTH + 1) + b"\xc0", "deeper"),
        (b"\x91" * 100_000 + b"\xc0", "deeper"),  # past msgspec's own recursion limit too
        (b"\x81\x01\x01", "keys must be str, got int"),  # a map with an int key
        (b"\x81\xa1k\x81\x01\x01", "keys must be str, got int"),
        (b"\x91\x81\xc4\x01k\x01", "keys must be str, got bytes"),
        (b"\x81\x91\x01\x01", "keys must be str, got tuple"),
        (b"\x81\xcb" + bytes(8) + b"\x01", "keys must be str, got float"),
        (b"\x81\xa1t\xd6\xff" + bytes(4), "datetime is not conditioning"),  # msgpack timestamp
        (ext(7, b""), "unknown msgpack extension type 7"),
        (b"\x81\xa1a" + ext(-2, b"xy"), "unknown msgpack extension type -2"),
    ],
)
def test_hostile_values_are_a_wire_error_that_says_what_is_wrong(data: bytes, match: str) -> None:
    with pytest.raises(WireError, match=match):
        decode_value(data)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (array_ext(b"<f4", (2,), bytes(4)), "takes 8 bytes, got 4"),
        (array_ext(b"<f4", (2,), bytes(12)), "takes 8 bytes, got 12"),
        (array_ext(b"<f4", (2**32, 2**32), bytes(8)), "got 8"),  # a product of absurd sides
        (array_ext(b"|u1", (2**64 - 1, 2**64 - 1), b""), "got 0"),
        (array_ext(b"<f4", (0, 2**63), b""), "no array of shape"),  # no bytes, no such array
        (array_ext(b"<f4", (0, 2**64 - 1), b""), "no array of shape"),
        (array_ext(b"|O8", (1,), bytes(8)), "not allowed"),  # object: never
        (array_ext(b"|V8", (1,), bytes(8)), "not allowed"),
        (array_ext(b"<U1", (1,), bytes(4)), "not allowed"),
        (array_ext(b"<M8", (1,), bytes(8)), "not allowed"),
        (array_ext(b"<i3", (1,), bytes(3)), "not allowed"),  # looks numeric, is no dtype
        (array_ext(b"float32", (1,), bytes(4)), "not allowed"),  # not as dtype.str says it
        (array_ext(b"=f4", (1,), bytes(4)), "not allowed"),
        (array_ext(b"<b1", (1,), bytes(1)), "not allowed"),
        (array_ext(b"[('a', '<f4')]", (1,), bytes(4)), "not allowed"),  # structured
        (array_ext(b"\xff\xfe", (1,), bytes(4)), "not allowed"),
        (array_ext(b"", (1,), bytes(4)), "not allowed"),
        (array_ext(b"<f4", (1,) * (MAX_NDIM + 1), bytes(4)), "dimensions"),
        (array_ext(b"<f4", (1,), b"", ndim=200), "dimensions"),
        (array_ext(b"<f4", (4,), b"", ndim=MAX_NDIM), "runs past the end"),
        (ext(ARRAY_EXT, bytes([1, 200]) + b"<f4"), "runs past the end"),
        (ext(ARRAY_EXT, b"\x01"), "runs past the end"),
        (ext(ARRAY_EXT, b""), "runs past the end"),
    ],
)
def test_an_array_with_a_lying_header_is_refused(data: bytes, match: str) -> None:
    for framed in (data, b"\x81\xa1a" + data, b"\x92\xc0" + data):
        with pytest.raises(WireError, match=match):
            decode_value(framed)


def test_an_honest_array_header_decodes() -> None:  # the layout the tests above lie in
    back = decode_value(array_ext(b"<f4", (2,), struct.pack("<2f", 1.0, 2.0)))
    assert exactly(back, np.array([1.0, 2.0], dtype="<f4"))
    empty = decode_value(array_ext(b">c16", (0, 3), b""))
    assert empty.shape == (0, 3) and empty.dtype.str == ">c16"


def test_nesting_deeper_than_max_depth_is_refused_both_ways() -> None:
    deepest = received(nested(MAX_DEPTH))
    assert decode_value(encode_value(nested(MAX_DEPTH))) == deepest
    assert decode_value(b"\x91" * MAX_DEPTH + b"\xc0") == deepest
    with pytest.raises(WireError, match="deeper"):
        encode_value(nested(MAX_DEPTH + 1))
    with pytest.raises(WireError, match="deeper"):
        encode_value({"a": nested(MAX_DEPTH)})  # the dict is one more
    with pytest.raises(WireError, match="deeper"):
        encode_value(nested(10_000))
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(WireError, match="deeper"):
        encode_value({"loop": loop})


class Color(enum.Enum):
    RED = 1


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"move": (0, 1), 7: 1}, "keys must be str, got int"),
        ({"a": {(1, 2): 1}}, "keys must be str, got tuple"),
        ([{b"k": 1}], "keys must be str, got bytes"),
        ({"move": {1, 2}}, "cannot send a set"),
        ({"f": object()}, "cannot send a object"),
        ({"c": 1j}, "cannot send a complex"),
        ({"c": np.complex64(1j)}, "cannot send a complex64"),
        ({"m": memoryview(b"x")}, "cannot send a memoryview"),
        ({"e": Color.RED}, "cannot send a Color"),
        ({"i": 2**64}, "64 bits"),
        ({"i": [-(2**63) - 1]}, "64 bits"),
        ({"a": np.array([object()])}, "cannot be sent"),
        ({"a": np.array(["text"])}, "cannot be sent"),
        ({"a": np.zeros((1,) * (MAX_NDIM + 1))}, "cannot be sent"),
        ([np.zeros(2, dtype=[("x", "<f4")])], "cannot be sent"),
    ],
)
def test_what_cannot_be_sent_is_refused_before_it_is_sent(value: object, match: str) -> None:
    with pytest.raises(WireError, match=match):
        encode_value(value)


def input_ext(slot: int, generation: int, dtype: bytes, shape: tuple[int, ...]) -> bytes:
    head = (
        bytes([len(shape), len(dtype)]) + dtype + b"".join(d.to_bytes(8, "little") for d in shape)
    )
    return ext(INPUT_EXT, struct.pack("<IQ", slot, generation) + head)


def test_an_input_reference_round_trips_and_a_lying_one_is_refused() -> None:
    ref = InputRef(7, 2**40, "|u1", (512, 512, 3))
    back = decode_value(encode_value({"frame": ref, "move": (0, 1)}))
    assert back == {"frame": ref, "move": (0, 1)}
    nested = {"frame": ref, "style": {"palette": [1, 2]}}  # not the flat common shape
    assert decode_value(encode_value(nested)) == {"frame": ref, "style": {"palette": (1, 2)}}
    assert decode_value(input_ext(7, 2**40, b"|u1", (512, 512, 3))) == ref
    for data, match in (
        (ext(INPUT_EXT, b"\x01\x02"), "runs past the end"),
        (input_ext(1, 1, b"|O8", (1,)), "not allowed"),
        (input_ext(1, 1, b"<f4", (1,) * (MAX_NDIM + 1)), "dimensions"),
        (input_ext(1, 1, b"<f4", (2,)) + b"", None),
        (ext(INPUT_EXT, struct.pack("<IQ", 1, 1) + bytes([1, 3]) + b"<f4" + bytes(9)), "after"),
    ):
        if match is None:
            assert decode_value(data) == InputRef(1, 1, "<f4", (2,))
            continue
        with pytest.raises(WireError, match=match):
            decode_value(data)
    with pytest.raises(WireError, match="cannot be sent"):
        encode_value({"frame": InputRef(1, 1, "|O8", (1,))})
