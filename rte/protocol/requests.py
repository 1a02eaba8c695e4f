"""The requests a client sends a serving loop, in process or over the wire.

They are plain frozen values: :mod:`rte.protocol.wire` encodes them for the
daemon's rings, :class:`rte.client.InProcessClient` puts them on a queue, and
:class:`rte.serve.ServeLoop` applies them. Each carries its sender's ``seq``,
which the notice that answers it carries back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rte.contract import Action
from rte.overload import DEFAULT_PRIORITY
from rte.state import SessionState

# an attach's conditioning key for the state a session moves in with (its bytes as
# a uint8 array: a large input, so a daemon's input slab carries it, not the ring)
STATE_KEY = "rte.state"


@dataclass(frozen=True)
class Attach:
    """Admit a session. Answered by ATTACHED, REJECTED (capacity) or ERROR.

    ``credits``: how many chunks the session may run ahead of its consumer
    (emitted and not yet released); 0 takes the host's default. The loop
    itself does not count them: its host picks the due sessions.
    ``priority``: its class under overload, 0 (highest) to 3 (see :mod:`rte.overload`).
    A conditioning with :data:`STATE_KEY` moves the session in with that state
    (exported or checkpointed elsewhere): it goes on at its next chunk index.
    """

    session: str
    conditioning: Mapping[str, Any] = field(default_factory=dict)
    seq: int = 0
    credits: int = 0
    priority: int = DEFAULT_PRIORITY


def with_state(conditioning: Mapping[str, Any], state: SessionState) -> dict[str, Any]:
    """An attach's conditioning that moves ``state`` in (see :func:`carried_state`)."""
    return {**conditioning, STATE_KEY: np.frombuffer(state.to_bytes(), np.uint8)}


def carried_state(conditioning: Mapping[str, Any]) -> SessionState | None:
    """The state an attach moves its session in with (None: it starts at chunk 0).
    StateError for bytes that are not a whole state of this version."""
    data = conditioning.get(STATE_KEY)
    if data is None:
        return None
    return SessionState.from_bytes(np.ascontiguousarray(data, np.uint8).tobytes())


@dataclass(frozen=True)
class Act:
    """Set conditioning keys for the session's next step. Answered only when
    refused (ERROR)."""

    session: str
    action: Action
    seq: int = 0


@dataclass(frozen=True)
class Detach:
    """Detach a session. With ``finalize`` its in-flight chunk is emitted first;
    without, it is dropped (the host knows it cannot be delivered). Answered by
    DETACHED or ERROR."""

    session: str
    finalize: bool = True
    seq: int = 0


@dataclass(frozen=True)
class Reset:
    """Detach then attach again: the session restarts from chunk 0.

    ``conditioning`` replaces the session's conditioning; None keeps the last.
    It is checked before anything changes: a refused reset leaves the session
    as it was. Answered by DETACHED then ATTACHED, or by ERROR.
    """

    session: str
    conditioning: Mapping[str, Any] | None = None
    seq: int = 0
    finalize: bool = True  # the old run's in-flight chunk is emitted first


@dataclass(frozen=True)
class Suspend:
    """Park a session: its row is freed, its state kept in the host's memory (the
    session stays its client's: nobody else may take its id). Answered by
    SUSPENDED; REJECTED when the host's park budget cannot hold it; ERROR for a
    model that exports no state (it stays attached) or a session not attached.
    Acting on a suspended session is refused until it is resumed."""

    session: str
    seq: int = 0


@dataclass(frozen=True)
class Resume:
    """Bring a suspended session back at the next step boundary: it goes on at its
    next chunk index, its frames those of a session never suspended. Answered by
    RESUMED; REJECTED while no row is free (it stays parked: retry); ERROR for
    a session that is not suspended."""

    session: str
    seq: int = 0


@dataclass(frozen=True)
class Export:
    """Hand a session's state over and let it go (to move it to another host:
    ``attach(s, state=...)`` there). The host suspends it (a suspended one as it
    is), gives its :class:`~rte.state.SessionState` to ``into`` and detaches it
    without finalizing (its in-flight chunk is in the state, made again where it
    goes). Answered by DETACHED then EXPORTED (message: the state's bytes);
    ERROR (it stays as it was) for a state ``into`` cannot hold, a model that
    exports no state or a session not attached.

    ``into``: a client's :class:`~rte.protocol.values.InputRef` on the wire (a
    slot of its own input segment the daemon writes the state's bytes into, so
    they never cross the ring); to the loop, a callable that takes the state
    and returns the bytes it holds, raising RequestError when it cannot
    (:class:`StateBox` in process).
    """

    session: str
    seq: int = 0
    into: Any = None


class StateBox:
    """An in-process export's ``into``: keeps the state itself (no bytes made)."""

    def __init__(self) -> None:
        self.state: SessionState | None = None

    def __call__(self, state: SessionState) -> int:
        self.state = state
        return state.nbytes


@dataclass(frozen=True)
class Stop:
    """Finalize every session (their in-flight chunks are emitted), detach, return."""


@dataclass(frozen=True)
class Wake:
    """Does nothing but end the loop's wait on its inbox: a host whose consumer
    freed room (so sessions are due again) sends it."""


Request = Attach | Act | Detach | Reset | Suspend | Resume | Export
DEFAULT_CREDITS = 2  # chunks a session may run ahead of its consumer: one held, one ready
