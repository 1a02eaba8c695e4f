"""The records between a shm client and the daemon.

Fixed binary headers (``struct``), never pickles:

    header   type u8 | code u8 | session length u16 | request seq u32 | handle u32
    session  utf-8 bytes (at most MAX_SESSION_BYTES)
    body     per type (below)

Client to daemon, one record per :mod:`rte.serve` request: ATTACH and ACT carry
conditioning (:mod:`rte.protocol.values`), RESET an optional one, DETACH, SUSPEND
and RESUME nothing; EXPORT ``{"into": InputRef}``, the client's slot the state goes to;
BYE says the client leaves; DRAIN (no body) asks the daemon to drain
(:mod:`rte.protocol.drain`: answered by a DRAINING notice for session "").
ATTACH's ``code`` is the session's credits (0: the daemon's default) and its
``handle`` field its priority class (0 to 3).
Daemon to client: NOTICE carries a :class:`~rte.contract.NoticeKind` in
``code`` (one to one: the enum's values are the codes) and a message; an
ATTACHED notice's ``handle`` is the small number by which STEP records name
that session until it is DETACHED.

STEP is one record per client and step, however many chunks: where they lie
in the slab, as columns the client reads in place (``memoryview`` s of the
record: no Python object per chunk, no NumPy call):

    fixed    n u32 | flags u32 (1: the slots are one run) | emitted_ns i64 |
             pushed_ns i64 | reserved u32
    columns  slot u64[n] | generation u64[n] | chunk i64[n] | generated_ns i64[n] |
             handle u32[n] | applied u32[n]

``applied`` is the seq of the last action each chunk's session had applied
before the chunk was generated (:mod:`rte.receipts`; 0: none).

The columns start 8-aligned (header and fixed part are 40 bytes), so the C
reads the slot and generation columns in place.

Decoding checks every length, so hostile bytes are a :class:`WireError` that
says what is wrong. An answer never fails for its size: :func:`encode_notice`
truncates a message (and says so) to fit the ring it goes to.
"""

from __future__ import annotations

import enum
import functools
import numbers
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rte.contract import Action, Notice, NoticeKind
from rte.errors import WireError
from rte.protocol.drain import Drain
from rte.protocol.requests import Act, Attach, Detach, Export, Request, Reset, Resume, Suspend
from rte.protocol.values import InputRef, decode_value, encode_value


class RecordType(enum.IntEnum):
    ATTACH = 1
    ACT = 2
    DETACH = 3
    RESET = 4
    BYE = 5
    SUSPEND = 6
    RESUME = 7
    EXPORT = 8
    DRAIN = 9
    NOTICE = 11
    STEP = 12


@dataclass(frozen=True)
class Bye:
    """A client leaves: its sessions are detached and its slot freed."""


HEADER = struct.Struct("<BBHII")
STEP = struct.Struct("<IIqqI")  # n, flags, emitted_ns, pushed_ns, reserved
STEP_AT = HEADER.size + STEP.size  # where the columns begin: 8-aligned
STEP_ROW_BYTES = 8 + 8 + 8 + 8 + 4 + 4  # bytes of the columns per chunk
MAX_PRIORITY = 3
MAX_CREDITS = 255
MAX_SESSION_BYTES = 256
TRUNCATED = " [truncated]"
_CONDITIONED = (RecordType.ATTACH, RecordType.ACT, RecordType.RESET)


def _header(kind: RecordType, session: str, seq: int, code: int = 0, handle: int = 0) -> bytes:
    name = session_bytes(session)
    return HEADER.pack(kind, code, len(name), seq & 0xFFFFFFFF, handle) + name


def session_bytes(session: object) -> bytes:
    """A session id as a record carries it; WireError unless it is a str of valid
    UTF-8 (no lone surrogate) of at most MAX_SESSION_BYTES bytes."""
    if not isinstance(session, str):
        raise WireError(f"a session id is a str, not {type(session).__name__}")
    try:
        name = session.encode()
    except UnicodeEncodeError as exc:
        raise WireError(
            f"session id {session!r} is not valid UTF-8 text ({exc.reason} at {exc.start}); "
            "use another id"
        ) from None
    if len(name) > MAX_SESSION_BYTES:
        raise WireError(
            f"session id of {len(name)} bytes is longer than {MAX_SESSION_BYTES}; use a shorter id"
        )
    return name


def checked_credits(credits: object) -> int:
    """An attach's credits as a record carries them; WireError unless a whole number
    from 0 (the daemon's default) to MAX_CREDITS (a bool is not one)."""
    if isinstance(credits, bool) or not isinstance(credits, numbers.Integral):
        raise WireError(
            f"credits must be a whole number, 1 to {MAX_CREDITS} (0: the default), not {credits!r}"
        )
    value = int(credits)
    if not 0 <= value <= MAX_CREDITS:
        raise WireError(f"credits {value}: must be 1 to {MAX_CREDITS} (0: the default)")
    return value


# -- client to daemon -----------------------------------------------------------


def encode_request(message: Request | Bye | Drain) -> bytes:
    """One request record; WireError for what cannot be sent (checked before sending)."""
    match message:
        case Attach():
            checked_credits(message.credits)
            _check_priority(message.priority)
            body = encode_value(dict(message.conditioning))
            head = _header(
                RecordType.ATTACH, message.session, message.seq, message.credits, message.priority
            )
            return head + body
        case Act():
            body = encode_value(dict(message.action.conditioning))
            return _header(RecordType.ACT, message.session, message.seq) + body
        case Detach():
            return _header(RecordType.DETACH, message.session, message.seq)
        case Suspend():
            return _header(RecordType.SUSPEND, message.session, message.seq)
        case Resume():
            return _header(RecordType.RESUME, message.session, message.seq)
        case Export():
            if type(message.into) is not InputRef:
                raise WireError("an export goes into a slot of its client's input segment")
            body = encode_value({"into": message.into})
            return _header(RecordType.EXPORT, message.session, message.seq) + body
        case Reset():
            fresh = message.conditioning
            body = b"" if fresh is None else encode_value(dict(fresh))
            return _header(RecordType.RESET, message.session, message.seq) + body
        case Bye():
            return _header(RecordType.BYE, "", 0)
        case Drain():
            return _header(RecordType.DRAIN, "", message.seq)
    raise WireError(f"{type(message).__name__} is not a request")


def _check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise WireError(f"priority must be a whole number 0 to {MAX_PRIORITY}, not {priority!r}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise WireError(f"priority must be 0 (highest) to {MAX_PRIORITY}, not {priority}")
    return priority


def request_seq(record: bytes) -> int:
    """The seq of a request record, as far as its header can be read (0 if not):
    so that even a malformed request's refusal answers the call that sent it."""
    return HEADER.unpack_from(record)[3] if len(record) >= HEADER.size else 0


def decode_request(record: bytes) -> Request | Bye | Drain:
    """Decode one client record; WireError, saying what is wrong, for anything else."""
    kind, code, session, seq, body = _split(record)
    if kind in _CONDITIONED:
        value = decode_value(body) if len(body) else None
        if value is not None and not isinstance(value, dict):
            raise WireError(f"conditioning must be a mapping, got {type(value).__name__}")
        if kind is RecordType.ATTACH:
            priority = _check_priority(HEADER.unpack_from(record)[4])
            return Attach(session, value or {}, seq, credits=code, priority=priority)
        if kind is RecordType.ACT:
            return Act(session, Action(value or {}), seq)
        return Reset(session, value, seq)
    if kind is RecordType.EXPORT:
        into = decode_value(body) if len(body) else None
        if not isinstance(into, dict) or type(into.get("into")) is not InputRef:
            raise WireError("EXPORT carries {'into': InputRef}, the slot its state goes to")
        return Export(session, seq, into["into"])
    if len(body):
        raise WireError(f"{kind.name} takes no body, got {len(body)} bytes")
    if kind is RecordType.DETACH:
        return Detach(session, seq=seq)
    if kind is RecordType.SUSPEND:
        return Suspend(session, seq)
    if kind is RecordType.RESUME:
        return Resume(session, seq)
    if kind is RecordType.BYE:
        return Bye()
    if kind is RecordType.DRAIN:  # drains the daemon for good: only as encode_request makes it
        if session or code or HEADER.unpack_from(record)[4]:
            raise WireError(
                "a DRAIN record carries no session, code or handle (a garbled record?): "
                "not draining; send it as encode_request(Drain(seq)) makes it"
            )
        return Drain(seq)
    raise WireError(f"a client cannot send {kind.name} records")


# -- daemon to client -----------------------------------------------------------


def encode_notice(notice: Notice, limit: int, handle: int = 0) -> bytes:
    """A NOTICE record of at most ``limit`` bytes: a message (or a session id)
    that would not fit is cut, and says so. ``handle``: an ATTACHED session's."""
    name = notice.session.encode()
    if len(name) > MAX_SESSION_BYTES or HEADER.size + len(name) > limit // 2:
        name = b""  # not a session this daemon serves: its refusal names none
    text = notice.message.encode()
    room = limit - HEADER.size - len(name)
    if len(text) > room:
        cut = text[: max(0, room - len(TRUNCATED))].decode(errors="ignore")
        text = (cut + TRUNCATED).encode()[:room]
    head = HEADER.pack(RecordType.NOTICE, notice.kind, len(name), notice.seq & 0xFFFFFFFF, handle)
    return head + name + text


def encode_step(
    slots: np.ndarray[Any, Any] | memoryview,
    generations: np.ndarray[Any, Any] | memoryview,
    chunks: Sequence[int],
    generated_ns: int | Sequence[int],
    handles: Sequence[int],
    *,
    contiguous: bool,
    emitted_ns: int,
    applied: Sequence[int] | None = None,
) -> bytearray:
    """One STEP record for ``len(slots)`` chunks, packed in one call; stamp it with
    :func:`stamp_pushed` right before pushing it. ``applied`` None: all 0."""
    n = len(slots)
    generated = [generated_ns] * n if isinstance(generated_ns, int) else generated_ns
    record = bytearray(STEP_AT + n * STEP_ROW_BYTES)
    HEADER.pack_into(record, 0, RecordType.STEP, 0, 0, 0, 0)
    STEP.pack_into(record, HEADER.size, n, int(contiguous), emitted_ns, 0, 0)
    _columns(n).pack_into(
        record, STEP_AT, *slots.tolist(), *generations.tolist(), *chunks, *generated, *handles
    )
    if applied is not None:
        _applied(n).pack_into(record, STEP_AT + (STEP_ROW_BYTES - 4) * n, *applied)
    return record


@functools.cache
def _columns(n: int) -> struct.Struct:
    return struct.Struct(f"<{n}Q{n}Q{n}q{n}q{n}I")


@functools.cache
def _applied(n: int) -> struct.Struct:
    return struct.Struct(f"<{n}I")


def stamp_pushed(record: bytearray, pushed_ns: int) -> None:
    """Write when a STEP record is pushed into it (the last thing before the push)."""
    _PUSHED.pack_into(record, _PUSHED_AT, pushed_ns)


class StepColumns(NamedTuple):
    """A STEP record's columns as ``memoryview`` s of the record (no NumPy call:
    the client's path from the ring to a batch). ``slots`` and ``generations``
    are unsigned words the C reads in place; ``chunks`` and ``generated_ns``
    signed; ``handles`` a list; ``applied`` unsigned (each row's receipt)."""

    contiguous: bool
    emitted_ns: int
    pushed_ns: int
    slots: memoryview
    generations: memoryview
    chunks: memoryview
    generated_ns: memoryview
    handles: list[int]
    applied: memoryview


def step_columns(record: bytes) -> StepColumns | None:
    """The columns of a STEP record (None for any other record; WireError for a
    STEP whose size does not match its count)."""
    if record[:1] != _STEP_TYPE:
        return None
    if len(record) < STEP_AT:
        raise WireError("STEP record is too short")
    n, flags, emitted, pushed, _ = STEP.unpack_from(record, HEADER.size)
    if n < 1 or len(record) != STEP_AT + n * STEP_ROW_BYTES:
        raise WireError(f"STEP of {n} chunks does not match its {len(record)} bytes")
    return step_of(record, n, flags, emitted, pushed)


def step_of(record: bytes, n: int, flags: int, emitted: int, pushed: int) -> StepColumns:
    """The columns of a STEP record of ``n`` rows whose fixed part says ``flags``,
    ``emitted`` and ``pushed``, unchecked: the one place the column views are
    built (:func:`step_columns` after its checks, and
    :func:`rte.protocol.steps.judged_step` after the C's)."""
    view = memoryview(record)
    words = view[STEP_AT : STEP_AT + 32 * n]
    return StepColumns(
        bool(flags & 1),
        emitted,
        pushed,
        words[: 8 * n].cast("Q"),
        words[8 * n : 16 * n].cast("Q"),
        words[16 * n : 24 * n].cast("q"),
        words[24 * n :].cast("q"),
        view[STEP_AT + 32 * n : STEP_AT + 36 * n].cast("I").tolist(),
        view[STEP_AT + 36 * n :].cast("I"),
    )


def decode_reply(record: bytes) -> Notice | StepColumns:
    """Decode one daemon record; WireError for anything else."""
    step = step_columns(record)
    if step is not None:
        return step
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
    raise WireError(f"a daemon does not send {kind.name} records")


def reply_handle(record: bytes) -> int:
    """The ``handle`` field of a daemon record (an ATTACHED notice's session handle)."""
    return int(HEADER.unpack_from(record)[4]) if len(record) >= HEADER.size else 0


# -- either ---------------------------------------------------------------------


def _split(record: bytes) -> tuple[RecordType, int, str, int, memoryview]:
    if len(record) < HEADER.size:
        raise WireError(f"record of {len(record)} bytes is shorter than a header")
    raw_type, code, name_len, seq, _ = HEADER.unpack_from(record)
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
    if isinstance(decoded, StepColumns):
        run = "one run" if decoded.contiguous else "scattered"
        return (
            f"STEP {len(decoded.handles)} chunks, handles={decoded.handles} "
            f"chunks={decoded.chunks.tolist()} slots={decoded.slots.tolist()} ({run})"
        )
    if isinstance(decoded, Notice):
        return (
            f"NOTICE {decoded.session!r} {decoded.kind.name} seq={decoded.seq} {decoded.message!r}"
        )
    return repr(decoded)


_REPLIES = (RecordType.STEP, RecordType.NOTICE)
_STEP_TYPE = bytes([RecordType.STEP])
_PUSHED, _PUSHED_AT = struct.Struct("<q"), HEADER.size + 16  # STEP's pushed_ns
