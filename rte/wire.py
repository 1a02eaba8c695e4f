"""The wire format between the shm client and the daemon.

Hot-path records are fixed binary headers (``struct``), never pickles:

    header   type u8 | notice kind u8 | session length u16 | request seq u32
    session  utf-8 bytes
    body     per type (below)

Client to daemon: ATTACH and ACT carry conditioning; RESET an optional one;
DETACH and BYE nothing. Daemon to client: CHUNK carries where the chunk lies in
the slab (slot, generation), its index, dtype, shape and timestamps; NOTICE a
kind and a message.

Conditioning (nested values and NumPy arrays) has its own schema'd binary
encoding, :func:`encode_value` / :func:`decode_value`: one tag byte per value,
lengths before contents, arrays as dtype + shape + raw bytes, numeric dtypes
only. The decoder checks every length against what remains and limits depth,
so hostile bytes give a :class:`WireError`, never a crash or an unbounded
allocation. Nothing read from shared memory is ever unpickled.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rte.errors import RteError


class WireError(RteError):
    """A record or value that does not follow the wire format."""


class RecordType(enum.IntEnum):
    ATTACH = 1
    ACT = 2
    DETACH = 3
    RESET = 4
    BYE = 5
    CHUNK = 10
    NOTICE = 11


class NoticeCode(enum.IntEnum):
    ATTACHED = 1
    DETACHED = 2
    REJECTED = 3  # admission refused: backpressure
    ERROR = 4


HEADER = struct.Struct("<BBHI")
CHUNK = struct.Struct("<QIQqqB")  # chunk, slot, generation, generated_ns, emitted_ns, ndim
MAX_DEPTH = 32
MAX_NDIM = 8


@dataclass(frozen=True)
class Record:
    """One decoded record. ``value`` is the conditioning (ATTACH, ACT, RESET) or
    the message (NOTICE); ``chunk`` the placement (CHUNK)."""

    type: RecordType
    session: str
    seq: int = 0
    code: int = 0
    value: Any = None
    chunk: ChunkRef | None = None


@dataclass(frozen=True)
class ChunkRef:
    chunk: int
    slot: int
    generation: int
    dtype: str
    shape: tuple[int, ...]
    generated_ns: int
    emitted_ns: int


def encode(type: RecordType, session: str, seq: int = 0, code: int = 0, body: bytes = b"") -> bytes:
    name = session.encode()
    if len(name) > 0xFFFF:
        raise WireError(f"session id of {len(name)} bytes is longer than 65535")
    return HEADER.pack(type, code, len(name), seq & 0xFFFFFFFF) + name + body


def encode_chunk(session: str, ref: ChunkRef) -> bytes:
    return ChunkEncoder(ref.dtype, ref.shape)(
        session, ref.chunk, ref.slot, ref.generation, ref.generated_ns, ref.emitted_ns
    )


class ChunkEncoder:
    """CHUNK records for one dtype and shape, with the fixed tail packed once."""

    def __init__(self, dtype: str, shape: tuple[int, ...]) -> None:
        raw = dtype.encode()
        self.ndim = len(shape)
        self.tail = struct.pack(f"<{len(shape)}Q", *shape) + bytes([len(raw)]) + raw

    def __call__(
        self, session: str, chunk: int, slot: int, generation: int, generated: int, emitted: int
    ) -> bytes:
        name = session.encode()
        return b"".join(
            (
                HEADER.pack(RecordType.CHUNK, 0, len(name), 0),
                name,
                CHUNK.pack(chunk, slot, generation, generated, emitted, self.ndim),
                self.tail,
            )
        )


def decode(record: bytes) -> Record:
    """Decode one record; WireError, saying what is wrong, for anything malformed."""
    if len(record) < HEADER.size:
        raise WireError(f"record of {len(record)} bytes is shorter than a header")
    raw_type, code, name_len, seq = HEADER.unpack_from(record)
    try:
        kind = RecordType(raw_type)
    except ValueError:
        raise WireError(f"unknown record type {raw_type}") from None
    body_at = HEADER.size + name_len
    if body_at > len(record):
        raise WireError("session id runs past the end of the record")
    try:
        session = record[HEADER.size : body_at].decode()
    except UnicodeDecodeError:
        raise WireError("session id is not valid utf-8") from None
    body = memoryview(record)[body_at:]
    if kind in (RecordType.ATTACH, RecordType.ACT, RecordType.RESET):
        value = decode_value(body) if len(body) else None
        if value is not None and not isinstance(value, dict):
            raise WireError(f"conditioning must be a mapping, got {type(value).__name__}")
        if kind is not RecordType.RESET and value is None:
            value = {}
        return Record(kind, session, seq, code, value)
    if kind is RecordType.NOTICE:
        try:
            return Record(kind, session, seq, code, bytes(body).decode())
        except UnicodeDecodeError:
            raise WireError("notice message is not valid utf-8") from None
    if kind is RecordType.CHUNK:
        return Record(kind, session, seq, code, chunk=_decode_chunk(body))
    if len(body):
        raise WireError(f"{kind.name} takes no body, got {len(body)} bytes")
    return Record(kind, session, seq, code)


def _decode_chunk(body: memoryview) -> ChunkRef:
    if len(body) < CHUNK.size:
        raise WireError("CHUNK body is too short")
    chunk, slot, generation, generated, emitted, ndim = CHUNK.unpack_from(body)
    if ndim > MAX_NDIM:
        raise WireError(f"CHUNK has {ndim} dimensions (at most {MAX_NDIM})")
    at = CHUNK.size + 8 * ndim
    if at + 1 > len(body):
        raise WireError("CHUNK shape runs past the end of the record")
    shape = struct.unpack_from(f"<{ndim}Q", body, CHUNK.size)
    dtype_len = body[at]
    if at + 1 + dtype_len != len(body):
        raise WireError("CHUNK dtype length does not match the record")
    dtype = bytes(body[at + 1 :]).decode("ascii", "replace")
    return ChunkRef(chunk, slot, generation, dtype, tuple(shape), generated, emitted)


# -- conditioning values -------------------------------------------------------


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
    array = np.frombuffer(view[end:stop], dtype=dtype).reshape(shape).copy()
    return array, stop
