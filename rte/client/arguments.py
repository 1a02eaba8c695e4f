"""What a caller hands a client, checked once for every client form.

Each public call of :class:`~rte.client.base.EngineClient` and of
:class:`~rte.client.aio.AsyncClient` passes its arguments through these checks
before anything is numbered, lent or sent, so that every form (in process, over
shared memory, either on an event loop) refuses the same arguments the same
way: a :class:`~rte.errors.RequestError` (a :class:`~rte.errors.WireError` for
what the records cannot carry) that says which argument and what it may be,
never a ``struct.error``, ``OverflowError`` or ``TypeError`` from inside the
client. The limits of session ids and credits are the wire's
(:mod:`rte.protocol.wire`), which checks them again when it encodes a request.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, cast

from rte.errors import RequestError
from rte.protocol.wire import checked_credits, session_bytes
from rte.state import SessionState

MAX_TIMEOUT_S = 1e6  # about eleven days: every wait below can count it in nanoseconds


def session(value: object) -> str:
    """A session id: a str of valid UTF-8 (no lone surrogate), at most 256 bytes."""
    session_bytes(value)  # WireError for what a record cannot carry
    return cast(str, value)


def credits(value: object) -> int:
    """An attach's credits: a whole number, 0 (the engine's default) to 255."""
    return checked_credits(value)


def conditioning(value: object, call: str, *, required: bool = False) -> dict[str, Any] | None:
    """Conditioning for ``call``: a mapping (copied), or None where it may be left out."""
    if value is None and not required:
        return None
    if not isinstance(value, Mapping):
        raise RequestError(
            f"{call}'s conditioning must be a mapping of keys to values, not {type(value).__name__}"
        )
    return dict(value)


def timeout(value: object, name: str = "timeout") -> float:
    """A wait in seconds: a number from 0 to MAX_TIMEOUT_S (not nan, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RequestError(
            f"{name} must be a number of seconds, not {type(value).__name__} {value!r}"
        )
    seconds = float(value)
    if not 0 <= seconds <= MAX_TIMEOUT_S:  # (nan is neither)
        raise RequestError(f"{name} {value!r}: must be 0 to {MAX_TIMEOUT_S:g} seconds")
    return seconds


def moved_state(session: str, state: object, conditioning: Mapping[str, Any]) -> Mapping[str, Any]:
    """An attach's ``state=``: a SessionState of this session, with no conditioning
    beside it (the state carries its own); RequestError otherwise."""
    if not isinstance(state, SessionState):
        raise RequestError(f"state must be a SessionState (client.export's), not {state!r}")
    if state.session != session:
        raise RequestError(
            f"the state of session {state.session!r} cannot attach as {session!r}: "
            "attach it under its own id"
        )
    if conditioning:
        raise RequestError(
            f"attach {session!r} with a state takes no conditioning: the state carries its "
            "own; act after it attaches"
        )
    return conditioning
