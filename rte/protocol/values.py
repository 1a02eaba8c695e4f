"""The conditioning codec: nested values and NumPy arrays as MessagePack, through msgspec.

Action conditioning (what a client sends with attach, act and reset) is nested
None/bool/int/float/str/bytes/list/tuple/dict[str, ...] and NumPy arrays. On
the wire it is one MessagePack value (msgspec's encoder and decoder, made once
here and reused), so a message is as small and as quick to make and to read as
msgpack allows. The value is at the top of the body and must take all of it.

- ``None``, ``bool``, ``str`` and ``bytes`` (a ``bytearray`` goes as bytes) are
  msgpack's own; a ``float`` is a float64; an ``int`` must fit 64 bits, as
  msgpack carries them (-2**63 to 2**64 - 1).
- A ``list`` and a ``tuple`` both go as a msgpack array, and **every array
  decodes as a tuple**: msgpack has one sequence type; a tuple is what clients
  send (``{"move": (0, 1)}`` arrives as it was sent), it cannot be changed in
  place by whoever holds the conditioning, and the models take either (``move``
  is any two ints). ``{"move": [0, 1]}`` arrives as ``{"move": (0, 1)}``.
- A mapping is a msgpack map whose keys are all ``str``, both ways.
- A NumPy array is extension type :data:`ARRAY_EXT` (1), whose data is
  ``ndim u8 | dtype length u8 | dtype | shape ndim x u64 | raw bytes``, little
  endian: ``dtype`` is NumPy's ``dtype.str`` (``"<f4"``, ``"|b1"``: byte order
  kept), numeric kinds only (bool, ints, floats, complex: never object, void or
  structured), at most :data:`MAX_NDIM` dims, the bytes in C order. A decoded
  array is the receiver's own writable copy, never a view of the ring.
- NumPy scalars (``np.int64``, ``np.float32``, ``np.bool_``) go as the plain
  Python values they hold.
- An :class:`InputRef` (an array lent through the daemon's input slab, see
  :mod:`rte.ipc.inputs`) is extension type :data:`INPUT_EXT` (2): ``slot u32 |
  generation u64`` then the array header above, without the bytes. Only the
  daemon turns it into an array, after checking the slot is the sender's.

The common body, a map of str keys to scalars and to arrays of scalars, is
decoded by a typed decoder (``dict[str, scalar | tuple[scalar, ...]] | None``)
that checks it in C; anything else by an untyped one (with the array
extension), whose result is checked here.

A value nests at most :data:`MAX_DEPTH` containers deep, both ways. What cannot
be sent, and any bytes this module did not make (truncated, flipped, a map with
an int key, an unknown extension, an array whose header and bytes disagree), is
a :class:`~rte.errors.WireError` that says what is wrong: never another
exception, a crash, or an allocation bigger than the bytes received. Nothing
read from shared memory is ever unpickled.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping
from typing import Any

import msgspec
import numpy as np

from rte.errors import WireError

MAX_DEPTH = 32
MAX_NDIM = 8
ARRAY_EXT = 1  # the msgpack extension type code of a NumPy array
INPUT_EXT = 2  # ... and of an InputRef


class InputRef:
    """An array in a slot of the daemon's input slab: which slot, at which
    generation, and the array's dtype (``dtype.str``) and shape."""

    __slots__ = ("dtype", "generation", "shape", "slot")

    def __init__(self, slot: int, generation: int, dtype: str, shape: tuple[int, ...]) -> None:
        self.slot = slot
        self.generation = generation
        self.dtype = dtype
        self.shape = tuple(shape)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InputRef) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[Any, ...]:
        return (self.slot, self.generation, self.dtype, self.shape)

    def __repr__(self) -> str:
        return f"InputRef(slot={self.slot}, generation={self.generation}, {self.dtype}{self.shape})"


_ARRAY_KINDS = "biufc"  # bool, ints, floats, complex: never object or void
_DTYPE = re.compile(rb"[<>|][biufc][0-9]{1,2}")  # what ``dtype.str`` of those kinds looks like
_ARRAY_HEAD = struct.Struct("<BB")  # ndim, dtype length
_INPUT_HEAD = struct.Struct("<IQ")  # slot, generation
_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_FLAT = _SCALARS | {np.ndarray, InputRef}  # leaves of the common small dict, checked in one loop
_SENDABLE = (bool, int, float, str, bytes, bytearray, np.bool_, np.integer, np.floating)


def _enc_hook(obj: Any) -> Any:
    """What msgspec does not encode itself: arrays, NumPy scalars, subclasses."""
    if isinstance(obj, np.ndarray):
        return _array_ext(obj)
    if isinstance(obj, InputRef):
        _check_array(np.empty((0,) * len(obj.shape), np.dtype(obj.dtype)))
        head = _INPUT_HEAD.pack(obj.slot, obj.generation)
        return msgspec.msgpack.Ext(INPUT_EXT, head + _array_head(np.dtype(obj.dtype), obj.shape))
    if isinstance(obj, bool | np.bool_):
        return bool(obj)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    raise WireError(f"cannot send a {type(obj).__name__} as conditioning")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == ARRAY_EXT:
        return _decode_array(data)
    if code == INPUT_EXT:
        if len(data) < _INPUT_HEAD.size:
            raise WireError("input reference runs past the end of its extension")
        slot, generation = _INPUT_HEAD.unpack_from(data)
        dtype, shape, end = _parse_head(data[_INPUT_HEAD.size :])
        if end != len(data) - _INPUT_HEAD.size:
            raise WireError("an input reference carries bytes after its shape")
        return InputRef(slot, generation, dtype.str, shape)
    raise WireError(f"unknown msgpack extension type {code}")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODER = msgspec.msgpack.Decoder(ext_hook=_ext_hook)
_Scalar = None | bool | int | float | str  # msgspec allows one of str and bytes in a union
_COMMON = msgspec.msgpack.Decoder(dict[str, _Scalar | tuple[_Scalar, ...]] | None)


def encode_value(value: Any) -> bytes:
    """Encode nested None/bool/int/float/str/bytes/list/tuple/dict[str, ...]/ndarray."""
    if type(value) is not dict or not _flat(value):
        _check_outgoing(value, 0)
    try:
        return _ENCODER.encode(value)
    except OverflowError:
        raise WireError("integers must fit in 64 bits (-2**63 to 2**64 - 1)") from None
    except (TypeError, ValueError) as exc:  # checked above: not expected, still a WireError
        raise WireError(f"cannot send this conditioning: {exc}") from None


def decode_value(data: bytes | memoryview) -> Any:
    """Decode what :func:`encode_value` made; WireError for anything else."""
    try:
        return _COMMON.decode(data)  # schema checked by msgspec: nothing left to check here
    except (msgspec.DecodeError, RecursionError):
        pass  # not the common shape, or not msgpack at all: the general decoder says which
    try:
        value = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise WireError(f"conditioning is not valid msgpack: {exc}") from None
    except RecursionError:  # msgspec's own limit, far above ours
        raise WireError(f"value nests deeper than {MAX_DEPTH}") from None
    return _received(value, 0)


def _flat(mapping: dict[Any, Any]) -> bool:
    """Whether ``mapping`` is str keys to scalars, arrays and lists/tuples of those,
    sendable as it is (the common case, checked in one loop)."""
    for key, item in mapping.items():
        if type(key) is not str:
            return False
        kind = type(item)
        if kind in _FLAT:
            continue
        if kind is not list and kind is not tuple:
            return False
        for leaf in item:
            if type(leaf) not in _FLAT:
                return False
    return True


def _check_outgoing(value: Any, depth: int) -> None:
    """WireError unless ``value`` is conditioning: its types, its keys, its depth."""
    if depth > MAX_DEPTH:
        raise WireError(f"conditioning nests deeper than {MAX_DEPTH}")
    if type(value) in _SCALARS:
        return
    if isinstance(value, list | tuple):
        for item in value:
            _check_outgoing(item, depth + 1)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise WireError(f"conditioning keys must be str, got {type(key).__name__}")
            _check_outgoing(item, depth + 1)
    elif isinstance(value, np.ndarray):
        _check_array(value)
    elif isinstance(value, InputRef):
        return  # (checked as it is encoded)
    elif not isinstance(value, _SENDABLE):
        raise WireError(f"cannot send a {type(value).__name__} as conditioning")


def _received(value: Any, depth: int) -> Any:
    """A decoded ``value`` as conditioning (lists made tuples), WireError if it is not:
    msgspec also makes non-str keys, tuples (as keys) and datetimes (extension -1)."""
    if depth > MAX_DEPTH:
        raise WireError(f"value nests deeper than {MAX_DEPTH}")
    kind = type(value)
    if kind is list:
        return tuple([_received(item, depth + 1) for item in value])
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise WireError(f"conditioning keys must be str, got {type(key).__name__}")
            value[key] = _received(item, depth + 1)  # the keys stay: iterating goes on
        return value
    if kind not in _FLAT:
        raise WireError(f"a {kind.__name__} is not conditioning")
    return value


def _check_array(array: np.ndarray[Any, Any]) -> None:
    if array.dtype.kind not in _ARRAY_KINDS or array.ndim > MAX_NDIM:
        raise WireError(f"arrays of dtype {array.dtype} and {array.ndim} dims cannot be sent")


def _array_head(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    text = dtype.str.encode()
    return b"".join(
        (_ARRAY_HEAD.pack(len(shape), len(text)), text, struct.pack(f"<{len(shape)}Q", *shape))
    )


def _array_ext(array: np.ndarray[Any, Any]) -> msgspec.msgpack.Ext:
    _check_array(array)
    return msgspec.msgpack.Ext(
        ARRAY_EXT, b"".join((_array_head(array.dtype, array.shape), array.tobytes()))
    )


def _parse_head(data: memoryview) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """An array header's dtype and shape, and where its bytes begin."""
    if len(data) < _ARRAY_HEAD.size:
        raise WireError("array header runs past the end of its extension")
    ndim, dtype_len = _ARRAY_HEAD.unpack_from(data)
    if ndim > MAX_NDIM:
        raise WireError(f"array has {ndim} dimensions (at most {MAX_NDIM})")
    shape_at = _ARRAY_HEAD.size + dtype_len
    raw_at = shape_at + 8 * ndim
    if raw_at > len(data):
        raise WireError("array header runs past the end of its extension")
    text = bytes(data[_ARRAY_HEAD.size : shape_at])
    try:
        dtype = np.dtype(text.decode("ascii")) if _DTYPE.fullmatch(text) else None
    except TypeError:  # "<i3": the right look, no such type
        dtype = None
    if dtype is None or dtype.kind not in _ARRAY_KINDS or dtype.str.encode() != text:
        raise WireError(f"array dtype {text!r} is not allowed (numeric dtypes only)")
    return dtype, struct.unpack_from(f"<{ndim}Q", data, shape_at), raw_at


def _decode_array(data: memoryview) -> np.ndarray[Any, Any]:
    """The array an extension holds, copied out of ``data`` (a view of the input)."""
    dtype, shape, raw_at = _parse_head(data)
    raw = data[raw_at:]
    nbytes = dtype.itemsize * math.prod(shape)
    if nbytes != len(raw):
        raise WireError(
            f"array of dtype {dtype} and shape {shape} takes {nbytes} bytes, got {len(raw)}"
        )
    try:  # (0, 2**63) holds no bytes, yet NumPy can make no such array
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    except ValueError as exc:
        raise WireError(f"no array of shape {shape} can be made: {exc}") from None
