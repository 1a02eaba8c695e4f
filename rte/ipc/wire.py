"""The records between a shm client and the daemon.

Fixed binary headers (``struct``), never pickles:

    header   type u8 | code u8 | session length u16 | request seq u32
    session  utf-8 bytes (at most MAX_SESSION_BYTES)
    body     per type (below)

Client to daemon, one record per :mod:`rte.serve` request: ATTACH and ACT carry
conditioning (:mod:`rte.ipc.values`), RESET an optional one, DETACH nothing;
BYE says the client leaves. Daemon to client: NOTICE carries a
:class:`~rte.contract.NoticeKind` in ``code`` (one to one: the enum's values
are the codes) and a message; CHUNK where the chunk lies in the slab (slot,
generation), its index, dtype, shape and timestamps.

Decoding checks every length, so hostile bytes are a :class:`WireError` that
says what is wrong. An answer never fails for its size: :func:`encode_notice`
truncates a message (and says so) to fit the ring it goes to.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any

from rte.contract import Action, Notice, NoticeKind
from rte.errors import WireError
from rte.ipc.values import MAX_NDIM, decode_value, encode_value
from rte.serve import Act, Attach, Detach, Request, Reset
from shm import SlotRef


class RecordType(enum.IntEnum):
    ATTACH = 1
    ACT = 2
    DETACH = 3
    RESET = 4
    BYE = 5
    CHUNK = 10
    NOTICE = 11


@dataclass(frozen=True)
class Bye:
    """A client leaves: its sessions are detached and its slot freed."""


HEADER = struct.Struct("<BBHI")
CHUNK = struct.Struct("<QIQqqB")  # chunk, slot, generation, generated_ns, emitted_ns, ndim
MAX_SESSION_BYTES = 256
TRUNCATED = " [truncated]"
_CONDITIONED = (RecordType.ATTACH, RecordType.ACT, RecordType.RESET)


@dataclass(frozen=True)
class ChunkRef:
    """Where one chunk lies in the slab, as a CHUNK record says."""

    session: str
    chunk: int
    slot: int
    generation: int
    dtype: str
    shape: tuple[int, ...]
    generated_ns: int
    emitted_ns: int


def _header(kind: RecordType, session: str, seq: int, code: int = 0) -> bytes:
    name = session.encode()
    if len(name) > MAX_SESSION_BYTES:
        raise WireError(
            f"session id of {len(name)} bytes is longer than {MAX_SESSION_BYTES}; use a shorter id"
        )
    return HEADER.pack(kind, code, len(name), seq & 0xFFFFFFFF) + name


# -- client to daemon -----------------------------------------------------------


def encode_request(message: Request | Bye) -> bytes:
    """One request record; WireError for what cannot be sent (checked before sending)."""
    match message:
        case Attach():
            body = encode_value(dict(message.conditioning))
            return _header(RecordType.ATTACH, message.session, message.seq) + body
        case Act():
            body = encode_value(dict(message.action.conditioning))
            return _header(RecordType.ACT, message.session, message.seq) + body
        case Detach():
            return _header(RecordType.DETACH, message.session, message.seq)
        case Reset():
            fresh = message.conditioning
            body = b"" if fresh is None else encode_value(dict(fresh))
            return _header(RecordType.RESET, message.session, message.seq) + body
        case Bye():
            return _header(RecordType.BYE, "", 0)
    raise WireError(f"{type(message).__name__} is not a request")


def request_seq(record: bytes) -> int:
    """The seq of a request record, as far as its header can be read (0 if not):
    so that even a malformed request's refusal answers the call that sent it."""
    return HEADER.unpack_from(record)[3] if len(record) >= HEADER.size else 0


def decode_request(record: bytes) -> Request | Bye:
    """Decode one client record; WireError, saying what is wrong, for anything else."""
    kind, _, session, seq, body = _split(record)
    if kind in _CONDITIONED:
        value = decode_value(body) if len(body) else None
        if value is not None and not isinstance(value, dict):
            raise WireError(f"conditioning must be a mapping, got {type(value).__name__}")
        if kind is RecordType.ATTACH:
            return Attach(session, value or {}, seq)
        if kind is RecordType.ACT:
            return Act(session, Action(value or {}), seq)
        return Reset(session, value, seq)
    if len(body):
        raise WireError(f"{kind.name} takes no body, got {len(body)} bytes")
    if kind is RecordType.DETACH:
        return Detach(session, seq=seq)
    if kind is RecordType.BYE:
        return Bye()
    raise WireError(f"a client cannot send {kind.name} records")


# -- daemon to client -----------------------------------------------------------


def encode_notice(notice: Notice, limit: int) -> bytes:
    """A NOTICE record of at most ``limit`` bytes: a message (or a session id)
    that would not fit is cut, and says so."""
    name = notice.session.encode()
    if len(name) > MAX_SESSION_BYTES or HEADER.size + len(name) > limit // 2:
        name = b""  # not a session this daemon serves: its refusal names none
    text = notice.message.encode()
    room = limit - HEADER.size - len(name)
    if len(text) > room:
        cut = text[: max(0, room - len(TRUNCATED))].decode(errors="ignore")
        text = (cut + TRUNCATED).encode()[:room]
    return HEADER.pack(RecordType.NOTICE, notice.kind, len(name), notice.seq & 0xFFFFFFFF) + (
        name + text
    )


class ChunkEncoder:
    """CHUNK records for one dtype and shape, with the fixed tail packed once."""

    def __init__(self, dtype: str, shape: tuple[int, ...]) -> None:
        raw = dtype.encode()
        self.ndim = len(shape)
        self.tail = struct.pack(f"<{len(shape)}Q", *shape) + bytes([len(raw)]) + raw

    def __call__(
        self, session: str, chunk: int, ref: SlotRef, generated: int, emitted: int
    ) -> bytes:
        name = session.encode()
        return b"".join(
            (
                HEADER.pack(RecordType.CHUNK, 0, len(name), 0),
                name,
                CHUNK.pack(chunk, ref.slot, ref.generation, generated, emitted, self.ndim),
                self.tail,
            )
        )


def decode_reply(record: bytes) -> Notice | ChunkRef:
    """Decode one daemon record; WireError for anything else."""
    kind, code, session, seq, body = _split(record)
    if kind is RecordType.NOTICE:
        try:
            notice_kind = NoticeKind(code)
        except ValueError:
            raise WireError(f"unknown notice kind {code}") from None
        try:
            return Notice(session, notice_kind, bytes(body).decode(), seq)
        except UnicodeDecodeError:
            raise WireError("notice message is not valid utf-8") from None
    if kind is RecordType.CHUNK:
        return _decode_chunk(session, body)
    raise WireError(f"a daemon does not send {kind.name} records")


def _decode_chunk(session: str, body: memoryview) -> ChunkRef:
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
    return ChunkRef(session, chunk, slot, generation, dtype, tuple(shape), generated, emitted)


# -- either ---------------------------------------------------------------------


def _split(record: bytes) -> tuple[RecordType, int, str, int, memoryview]:
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
    if name_len > MAX_SESSION_BYTES:
        raise WireError(f"session id of {name_len} bytes is longer than {MAX_SESSION_BYTES}")
    try:
        session = record[HEADER.size : body_at].decode()
    except UnicodeDecodeError:
        raise WireError("session id is not valid utf-8") from None
    return kind, code, session, seq, memoryview(record)[body_at:]


def describe(record: bytes) -> str:
    """One line about any record, for people (``rte inspect --ring``)."""
    try:
        is_reply = bool(record) and record[0] in _REPLIES
        decoded: Any = decode_reply(record) if is_reply else decode_request(record)
    except Exception as exc:  # a tool must show any bytes, however broken
        return f"<undecodable {len(record)} bytes: {exc}>"
    if isinstance(decoded, ChunkRef):
        return (
            f"CHUNK {decoded.session!r} chunk={decoded.chunk} slot={decoded.slot} "
            f"gen={decoded.generation} {decoded.dtype}{list(decoded.shape)}"
        )
    if isinstance(decoded, Notice):
        return (
            f"NOTICE {decoded.session!r} {decoded.kind.name} seq={decoded.seq} {decoded.message!r}"
        )
    return repr(decoded)


_REPLIES = (RecordType.CHUNK, RecordType.NOTICE)
