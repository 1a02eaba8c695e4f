"""The Level-2 loop: drive an engine from an inbox and into an outbox.

The loop never knows what the queues are: anything with ``get(timeout=)``
(raising ``queue.Empty``) and ``get_nowait()`` is an inbox, anything with
``put(item)`` an outbox. In one process they are ``queue.Queue`` s (that is
what :class:`rte.client.InProcessClient` runs); the daemon hosts the same
:class:`ServeLoop` behind its shared-memory rings.

Each turn is a short numbered sequence:

1. drain the inbox (block briefly only when no session is due);
2. apply each message (attach, act, detach, reset, stop); a bad message
   becomes an ``ERROR`` notice for its sender, never a crash;
3. step the due sessions with the actions that arrived;
4. put every emitted chunk, and every notice, into the outbox;
5. wait for the next tick when a pace is set.

:class:`ServeLoop` does steps 2 to 4 and returns what happened as values (a
list of :class:`~rte.contract.StepResult` and :class:`~rte.contract.Notice`),
never through exceptions: the host decides where each goes. Each notice that
answers a request carries that request's ``seq``. The one exception:
:class:`~rte.errors.EngineFault` (the engine's device failed for good) ends
the loop, so its host fails closed instead of serving errors.

Run it on the thread that will step the engine for its whole life (CUDA
streams are per-thread): ``threading.Thread(target=default_serve, ...)``.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rte.contract import Action, Engine, Notice, NoticeKind, ResultKind, StepResult
from rte.errors import AdmissionError, EngineFault, UnknownSessionError


@dataclass(frozen=True)
class Attach:
    """Admit a session. Answered by ATTACHED, REJECTED (capacity) or ERROR.

    ``credits``: how many chunks the session may run ahead of its consumer
    (emitted and not yet released); 0 takes the host's default. The loop
    itself does not count them: its host picks the due sessions.
    """

    session: str
    conditioning: Mapping[str, Any] = field(default_factory=dict)
    seq: int = 0
    credits: int = 0


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
class Stop:
    """Finalize every session (their in-flight chunks are emitted), detach, return."""


@dataclass(frozen=True)
class Wake:
    """Does nothing but end the loop's wait on its inbox: a host whose consumer
    freed room (so sessions are due again) sends it."""


Request = Attach | Act | Detach | Reset
OutboxItem = StepResult | Notice
DEFAULT_CREDITS = 2  # chunks a session may run ahead of its consumer: one held, one ready


class Inbox(Protocol):
    def get(self, block: bool = True, timeout: float | None = None) -> Any: ...

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
    due: Callable[[list[str]], list[str]] | None = None,
) -> None:
    """Serve ``engine`` until a :class:`Stop` arrives.

    Args:
        pace_hz: target steps per second; None steps as fast as possible.
        idle_wait_s: how long one inbox wait lasts while no session is due.
        due: picks, from the attached sessions, those to step this turn (a
            host's backpressure: a consumer that has not caught up); default all.
            A host that makes sessions due again puts :class:`Wake` in the inbox.
    """
    loop = ServeLoop(engine)
    pick = due or (lambda sessions: sessions)
    period = 1.0 / pace_hz if pace_hz else 0.0
    next_tick = time.monotonic()
    while True:
        block = not pick(loop.sessions)
        for message in _drain(inbox, block=block, timeout=idle_wait_s):
            if isinstance(message, Stop):
                _put(outbox, loop.stop())
                return
            _put(outbox, loop.handle(message))
        _put(outbox, loop.step(pick(loop.sessions)))
        if period:
            next_tick += period
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_tick = time.monotonic()  # fell behind: do not try to catch up in a burst


def _put(outbox: Outbox, items: list[OutboxItem]) -> None:
    """Everything one call produced; an outbox with ``put_many`` takes it whole
    (a step's chunks are then one batch for its consumer)."""
    if not items:
        return
    put_many = getattr(outbox, "put_many", None)
    if put_many is not None:
        put_many(items)
        return
    for item in items:
        outbox.put(item)


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
    """Steps 2 to 4 of the loop, for any host (default_serve, the daemon).

    ``handle`` applies one message, ``step`` advances the due sessions, and
    both return what came of it; neither raises for anything a sender did.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.conditioning: dict[str, dict[str, Any]] = {}  # attached sessions, in order
        self.actions: dict[str, dict[str, Any]] = {}

    @property
    def sessions(self) -> list[str]:
        """The attached sessions, in the order they came."""
        return list(self.conditioning)

    def handle(self, message: object) -> list[OutboxItem]:
        """Apply one request; the notices (and finalized chunks) it produced."""
        session = getattr(message, "session", "")
        seq = getattr(message, "seq", 0)
        out: list[OutboxItem] = []
        try:
            match message:
                case Attach():
                    self._attach(message.session, message.conditioning, seq, out)
                case Act():
                    self._act(message.session, message.action)
                case Detach():
                    self._require(message.session)
                    self.detach(message.session, finalize=message.finalize, seq=seq, out=out)
                case Reset():
                    self._reset(message, out)
                case Wake():
                    pass
                case _:
                    raise TypeError(f"unknown inbox message {type(message).__name__}")
        except AdmissionError as exc:
            out.append(Notice(session, NoticeKind.REJECTED, str(exc), seq))
        except EngineFault:
            raise  # the engine cannot go on: the host fails closed
        except Exception as exc:
            out.append(Notice(session, NoticeKind.ERROR, f"{type(exc).__name__}: {exc}", seq))
        return out

    def step(self, due: list[str] | None = None) -> list[OutboxItem]:
        """Step ``due`` (default: every attached session) with the actions that arrived."""
        due = self.sessions if due is None else due
        if not due:
            return []
        pending = self.actions
        actions = {s: Action(pending.pop(s)) for s in due if s in pending} if pending else None
        try:
            results = self.engine.step(due, actions)
        except EngineFault:
            raise
        except Exception as exc:
            return [Notice("", NoticeKind.ERROR, f"step failed: {type(exc).__name__}: {exc}")]
        return self._emitted(results)

    def stop(self) -> list[OutboxItem]:
        """Finalize and detach every session."""
        out: list[OutboxItem] = []
        for session in self.sessions:
            try:
                self.detach(session, out=out)
            except Exception as exc:
                out.append(Notice(session, NoticeKind.ERROR, f"{type(exc).__name__}: {exc}"))
        return out

    def detach(
        self,
        session: str,
        *,
        finalize: bool = True,
        reason: str = "",
        seq: int = 0,
        out: list[OutboxItem] | None = None,
    ) -> list[OutboxItem]:
        """Detach an attached session (a host's own decision: ``reason`` says why).

        With ``finalize`` its in-flight chunk comes first; if finalizing fails
        the chunk is reported DROPPED and the detach goes on. Raises what the
        engine's detach raises (the session then stays attached).
        """
        out = [] if out is None else out
        if finalize:
            try:
                out += self._emitted(self.engine.finalize([session]))
            except EngineFault:
                raise
            except Exception as exc:  # its in-flight chunk is lost; the detach still goes on
                out.append(Notice(session, NoticeKind.DROPPED, f"in-flight chunk lost: {exc}"))
        self.engine.detach(session)
        del self.conditioning[session]
        self.actions.pop(session, None)
        out.append(Notice(session, NoticeKind.DETACHED, reason, seq))
        return out

    # -- requests ---------------------------------------------------------

    def _attach(
        self, session: str, conditioning: Mapping[str, Any], seq: int, out: list[OutboxItem]
    ) -> None:
        if not session:
            raise ValueError('the session id "" is reserved (notices about the whole engine)')
        self.engine.attach(session, conditioning)
        if session not in self.conditioning:
            self.conditioning[session] = dict(conditioning)
        out.append(Notice(session, NoticeKind.ATTACHED, "", seq))

    def _act(self, session: str, action: Action) -> None:
        self._require(session)
        self._check(session, action.conditioning)
        self.actions.setdefault(session, {}).update(action.conditioning)
        self.conditioning[session].update(action.conditioning)

    def _reset(self, message: Reset, out: list[OutboxItem]) -> None:
        session = message.session
        self._require(session)
        fresh = message.conditioning
        if fresh is not None:
            self._check(session, fresh)  # refuse before anything changes
        keep = dict(self.conditioning[session] if fresh is None else fresh)
        self.detach(session, finalize=message.finalize, seq=message.seq, out=out)
        self._attach(session, keep, message.seq, out)

    def _check(self, session: str, conditioning: Mapping[str, Any]) -> None:
        """Refuse malformed conditioning now, not at the session's next step."""
        check = getattr(self.engine, "check_action", None)
        if check is not None:
            check(session, Action(conditioning))

    def _emitted(self, results: list[StepResult]) -> list[OutboxItem]:
        chunk = ResultKind.CHUNK
        out: list[OutboxItem] = [r for r in results if r.kind is chunk]
        if len(out) < len(results):  # some carry no chunk: their errors become notices
            for r in results:
                if r.kind is ResultKind.ERROR:
                    out.append(Notice(r.session, NoticeKind.ERROR, r.error or ""))
                elif r.kind is ResultKind.FAILED:  # its own failure: the engine let it go
                    out.append(Notice(r.session, NoticeKind.ERROR, r.error or ""))
                    self.detach(r.session, finalize=False, reason=r.error or "", out=out)
        return out

    def _require(self, session: str) -> None:
        if session not in self.conditioning:
            raise UnknownSessionError(f"session {session!r} is not attached")
