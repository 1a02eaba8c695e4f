"""The conditioning codec: nested values and NumPy arrays as schema'd bytes.

Action conditioning (what a client sends with attach, act and reset) is nested
None/bool/int/float/str/bytes/list/tuple/dict[str, ...] and NumPy arrays. One
tag byte per value, lengths before contents, arrays as dtype + shape + raw
bytes, numeric dtypes only. The decoder checks every length against what
remains and limits depth, so hostile bytes give a :class:`~rte.errors.WireError`,
never a crash or an unbounded allocation. Nothing read from shared memory is
ever unpickled.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from rte.errors import WireError

MAX_DEPTH = 32
MAX_NDIM = 8


class _Tag(enum.IntEnum):
    NONE = 0
    FALSE = 1
    TRUE = 2
    INT = 3
    FLOAT = 4
    STR = 5
    BYTES = 6
    LIST = 7
    TUPLE = 8
    DICT = 9
    ARRAY = 10


_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_ARRAY_KINDS = "biufc"  # bool, ints, floats, complex: never object or void


def encode_value(value: Any) -> bytes:
    """Encode nested None/bool/int/float/str/bytes/list/tuple/dict[str, ...]/ndarray."""
    out = bytearray()
    _encode(value, out, 0)
    return bytes(out)


def _encode(value: Any, out: bytearray, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise WireError(f"conditioning nests deeper than {MAX_DEPTH}")
    if value is None:
        out.append(_Tag.NONE)
    elif isinstance(value, bool | np.bool_):
        out.append(_Tag.TRUE if value else _Tag.FALSE)
    elif isinstance(value, int | np.integer):
        if not -(1 << 63) <= int(value) < (1 << 63):
            raise WireError(f"integer {value} does not fit in 64 bits")
        out.append(_Tag.INT)
        out += _I64.pack(int(value))
    elif isinstance(value, float | np.floating):
        out.append(_Tag.FLOAT)
        out += _F64.pack(float(value))
    elif isinstance(value, str):
        _sized(out, _Tag.STR, value.encode())
    elif isinstance(value, bytes | bytearray):
        _sized(out, _Tag.BYTES, bytes(value))
    elif isinstance(value, list | tuple):
        out.append(_Tag.LIST if isinstance(value, list) else _Tag.TUPLE)
        out += _U32.pack(len(value))
        for item in value:
            _encode(item, out, depth + 1)
    elif isinstance(value, Mapping):
        out.append(_Tag.DICT)
        out += _U32.pack(len(value))
        for key, item in value.items():
            if not isinstance(key, str):
                raise WireError(f"conditioning keys must be str, got {type(key).__name__}")
            _encode(key, out, depth + 1)
            _encode(item, out, depth + 1)
    elif isinstance(value, np.ndarray):
        if value.dtype.kind not in _ARRAY_KINDS or value.ndim > MAX_NDIM:
            raise WireError(f"arrays of dtype {value.dtype} and {value.ndim} dims cannot be sent")
        dtype = value.dtype.str.encode()
        out.append(_Tag.ARRAY)
        out += bytes([len(dtype)]) + dtype + bytes([value.ndim])
        out += struct.pack(f"<{value.ndim}Q", *value.shape)
        out += np.ascontiguousarray(value).tobytes()
    else:
        raise WireError(f"cannot send a {type(value).__name__} as conditioning")


def _sized(out: bytearray, tag: _Tag, data: bytes) -> None:
    out.append(tag)
    out += _U32.pack(len(data))
    out += data


def decode_value(data: bytes | memoryview) -> Any:
    """Decode what :func:`encode_value` made; WireError for anything else."""
    view = memoryview(data)
    value, at = _decode(view, 0, 0)
    if at != len(view):
        raise WireError(f"{len(view) - at} stray bytes after the value")
    return value


def _take(view: memoryview, at: int, n: int) -> int:
    if n < 0 or at + n > len(view):
        raise WireError("value runs past the end of the record")
    return at + n


def _decode(view: memoryview, at: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise WireError(f"value nests deeper than {MAX_DEPTH}")
    end = _take(view, at, 1)
    try:
        tag = _Tag(view[at])
    except ValueError:
        raise WireError(f"unknown value tag {view[at]}") from None
    at = end
    if tag is _Tag.NONE:
        return None, at
    if tag in (_Tag.FALSE, _Tag.TRUE):
        return tag is _Tag.TRUE, at
    if tag is _Tag.INT:
        end = _take(view, at, 8)
        return _I64.unpack_from(view, at)[0], end
    if tag is _Tag.FLOAT:
        end = _take(view, at, 8)
        return _F64.unpack_from(view, at)[0], end
    if tag in (_Tag.STR, _Tag.BYTES):
        start = _take(view, at, 4)
        n = _U32.unpack_from(view, at)[0]
        end = _take(view, start, n)
        raw = bytes(view[start:end])
        if tag is _Tag.BYTES:
            return raw, end
        try:
            return raw.decode(), end
        except UnicodeDecodeError:
            raise WireError("string is not valid utf-8") from None
    if tag in (_Tag.LIST, _Tag.TUPLE, _Tag.DICT):
        _take(view, at, 4)
        count = _U32.unpack_from(view, at)[0]
        at += 4
        if count > len(view) - at:  # every item takes at least one byte
            raise WireError(f"container claims {count} items in {len(view) - at} bytes")
        if tag is _Tag.DICT:
            result: dict[str, Any] = {}
            for _ in range(count):
                key, at = _decode(view, at, depth + 1)
                if not isinstance(key, str):
                    raise WireError("dict keys must be strings")
                result[key], at = _decode(view, at, depth + 1)
            return result, at
        items = []
        for _ in range(count):
            item, at = _decode(view, at, depth + 1)
            items.append(item)
        return (items if tag is _Tag.LIST else tuple(items)), at
    return _decode_array(view, at)


def _decode_array(view: memoryview, at: int) -> tuple[Any, int]:
    _take(view, at, 1)
    dtype_len = view[at]
    start = at + 1
    at = _take(view, start, dtype_len)
    try:
        dtype = np.dtype(bytes(view[start:at]).decode("ascii"))
    except (TypeError, ValueError, UnicodeDecodeError):
        raise WireError("array dtype is not a valid numeric dtype") from None
    if dtype.kind not in _ARRAY_KINDS:
        raise WireError(f"array dtype {dtype} is not allowed (numeric only)")
    _take(view, at, 1)
    ndim = view[at]
    at += 1
    if ndim > MAX_NDIM:
        raise WireError(f"array has {ndim} dimensions (at most {MAX_NDIM})")
    end = _take(view, at, 8 * ndim)
    shape = struct.unpack_from(f"<{ndim}Q", view, at)
    nbytes = dtype.itemsize * math.prod(shape)
    stop = _take(view, end, nbytes)
    try:  # (0, 2**63) holds no bytes, yet NumPy can make no such array
        array = np.frombuffer(view[end:stop], dtype=dtype).reshape(shape).copy()
    except ValueError as exc:
        raise WireError(f"no array of shape {shape} can be made: {exc}") from None
    return array, stop
