"""The Level-2 loop: drive an engine from an inbox and into an outbox.

The loop never knows what the queues are: anything with ``get(timeout=)``
(raising ``queue.Empty``) and ``get_nowait()`` is an inbox, anything with
``put(item)`` an outbox. In one process they are ``queue.Queue`` s; the daemon
hands it shared-memory rings behind the same two methods.

Each turn is a short numbered sequence:

1. drain the inbox (block briefly only when no session is attached);
2. apply each message (attach, act, detach, reset, stop); a bad message
   becomes an ``ERROR`` notice for its sender, never a crash;
3. step every attached session with the actions that arrived;
4. put every emitted chunk, and every per-session error, into the outbox;
5. wait for the next tick when a pace is set.

Run it on the thread that will step the engine for its whole life (CUDA
streams are per-thread): ``threading.Thread(target=default_serve, ...)``.
"""

from __future__ import annotations

import enum
import queue
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rte.contract import Action, Engine, ResultKind, StepResult
from rte.errors import AdmissionError, UnknownSessionError


@dataclass(frozen=True)
class Attach:
    session: str
    conditioning: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Act:
    session: str
    action: Action


@dataclass(frozen=True)
class Detach:
    """Detach a session. With ``finalize`` its in-flight chunk is emitted first;
    without, it is dropped (the host knows it cannot be delivered)."""

    session: str
    finalize: bool = True


@dataclass(frozen=True)
class Reset:
    """Detach then attach again: the session restarts from chunk 0.

    ``conditioning`` replaces the session's conditioning; None keeps the last.
    """

    session: str
    conditioning: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Stop:
    """Finalize every session (their in-flight chunks are emitted), detach, return."""


InboxMessage = Attach | Act | Detach | Reset | Stop


class NoticeKind(enum.Enum):
    ATTACHED = "attached"
    DETACHED = "detached"
    REJECTED = "rejected"  # an attach refused by AdmissionError (backpressure)
    ERROR = "error"  # a message or a step failed for this session
    DROPPED = "dropped"  # a chunk could not be emitted (its session goes on or went)


@dataclass(frozen=True)
class Notice:
    """What happened to a session, other than a chunk. ``session`` is "" for the engine."""

    session: str
    kind: NoticeKind
    message: str = ""


OutboxItem = StepResult | Notice


class Inbox(Protocol):
    def get(self, timeout: float | None = None) -> Any: ...

    def get_nowait(self) -> Any: ...


class Outbox(Protocol):
    def put(self, item: Any) -> None: ...


def default_serve(
    engine: Engine,
    inbox: Inbox,
    outbox: Outbox,
    *,
    pace_hz: float | None = None,
    idle_wait_s: float = 0.05,
) -> None:
    """Serve ``engine`` until a :class:`Stop` arrives.

    Args:
        pace_hz: target steps per second; None steps as fast as possible.
        idle_wait_s: how long one inbox wait lasts while nothing is attached.
    """
    loop = ServeLoop(engine, outbox)
    period = 1.0 / pace_hz if pace_hz else 0.0
    next_tick = time.monotonic()
    while True:
        for message in _drain(inbox, block=not loop.conditioning, timeout=idle_wait_s):
            if not loop.handle(message):
                return
        loop.step()
        if period:
            next_tick += period
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_tick = time.monotonic()  # fell behind: do not try to catch up in a burst


def _drain(inbox: Inbox, *, block: bool, timeout: float) -> list[Any]:
    messages = []
    if block:
        try:
            messages.append(inbox.get(timeout=timeout))
        except queue.Empty:
            return messages
    while True:
        try:
            messages.append(inbox.get_nowait())
        except queue.Empty:
            return messages


class ServeLoop:
    """Steps 2 to 4 of the loop, for hosts that bring their own inbox (the daemon).

    ``handle`` applies one message; ``step`` advances the attached sessions
    (or the ``due`` subset) and puts every chunk and error into the outbox.
    """

    def __init__(self, engine: Engine, outbox: Outbox) -> None:
        self.engine = engine
        self.outbox = outbox
        self.conditioning: dict[str, dict[str, Any]] = {}  # attached sessions, in order
        self.actions: dict[str, dict[str, Any]] = {}

    def handle(self, message: object) -> bool:
        """Apply one message; False when the loop must end."""
        session = getattr(message, "session", "")
        try:
            match message:
                case Attach():
                    self._attach(message.session, message.conditioning)
                case Act():
                    self._require(message.session)
                    check = getattr(self.engine, "check_action", None)
                    if check is not None:  # refuse a bad action now, not at its step
                        check(message.session, message.action)
                    self.actions.setdefault(message.session, {}).update(message.action.conditioning)
                    self.conditioning[message.session].update(message.action.conditioning)
                case Detach():
                    self._require(message.session)
                    self._detach(message.session, finalize=message.finalize)
                case Reset():
                    self._require(message.session)
                    fresh = message.conditioning
                    keep = self.conditioning[message.session] if fresh is None else fresh
                    self._detach(message.session)
                    self._attach(message.session, dict(keep))
                case Stop():
                    self.stop()
                    return False
                case _:
                    raise TypeError(f"unknown inbox message {type(message).__name__}")
        except AdmissionError as exc:
            self.outbox.put(Notice(session, NoticeKind.REJECTED, str(exc)))
        except Exception as exc:
            self.outbox.put(Notice(session, NoticeKind.ERROR, f"{type(exc).__name__}: {exc}"))
        return True

    def step(self, due: list[str] | None = None) -> None:
        """Step ``due`` (default: every attached session) with the actions that arrived."""
        due = list(self.conditioning) if due is None else due
        if not due:
            return
        actions = {s: Action(a) for s, a in self.actions.items() if s in due}
        for session in actions:
            del self.actions[session]
        try:
            results = self.engine.step(due, actions)
        except Exception as exc:
            self.outbox.put(
                Notice("", NoticeKind.ERROR, f"step failed: {type(exc).__name__}: {exc}")
            )
            return
        self._emit(results)

    def stop(self) -> None:
        for session in list(self.conditioning):
            try:
                self._detach(session)
            except Exception as exc:
                self.outbox.put(Notice(session, NoticeKind.ERROR, f"{type(exc).__name__}: {exc}"))

    def _attach(self, session: str, conditioning: Mapping[str, Any]) -> None:
        self.engine.attach(session, conditioning)
        if session not in self.conditioning:
            self.conditioning[session] = dict(conditioning)
        self.outbox.put(Notice(session, NoticeKind.ATTACHED))

    def _detach(self, session: str, *, finalize: bool = True) -> None:
        try:
            if finalize:
                self._emit(self.engine.finalize([session]))
        except Exception as exc:  # its in-flight chunk is lost; the detach still goes on
            self.outbox.put(Notice(session, NoticeKind.DROPPED, f"in-flight chunk lost: {exc}"))
        self.engine.detach(session)
        del self.conditioning[session]
        self.actions.pop(session, None)
        self.outbox.put(Notice(session, NoticeKind.DETACHED))

    def _emit(self, results: list[StepResult]) -> None:
        for result in results:
            if result.kind is ResultKind.CHUNK:
                self.outbox.put(result)
            elif result.kind is ResultKind.ERROR:
                self.outbox.put(Notice(result.session, NoticeKind.ERROR, result.error or ""))

    def _require(self, session: str) -> None:
        if session not in self.conditioning:
            raise UnknownSessionError(f"session {session!r} is not attached")
