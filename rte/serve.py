"""The Level-2 loop: drive an engine from an inbox and into an outbox.

The loop never knows what the queues are: anything with ``get(timeout=)``
(raising ``queue.Empty``) and ``get_nowait()`` is an inbox, anything with
``put(item)`` an outbox. In one process they are ``queue.Queue`` s (that is
what :class:`rte.client.InProcessClient` runs); the daemon hosts the same
:class:`ServeLoop` behind its shared-memory rings.

Each turn is a short numbered sequence:

1. drain the inbox (block briefly only when no session is due; :mod:`rte.queues`);
2. apply each message (attach, act, detach, reset, suspend, resume, stop); a
   bad message becomes an ``ERROR`` notice for its sender, never a crash;
3. step the due sessions with the actions that arrived;
4. put every emitted chunk, and every notice, into the outbox (:mod:`rte.delivery`);
5. wait for the next tick when a pace is set (:class:`~rte.realtime.Pacer`).

Real time lives in the loop, so every host admits, ranks and paces alike: a
host brackets each turn with ``begin_turn``/``end_turn`` (the cost model of
:mod:`rte.realtime`); a paced loop refuses an attach past its real-time
capacity and filters the due list through the overload governor
(:mod:`rte.overload`; the turn's clock, cost model and governor are
:class:`rte.turns.Turns`); each chunk carries its receipt (:mod:`rte.receipts`)
of the actions that arrived since its session's last step
(:class:`rte.pending.PendingActions`).

:class:`ServeLoop` does steps 2 to 4 and returns what happened as values (a
list of :class:`~rte.contract.StepResult` and :class:`~rte.contract.Notice`;
a host may have each engine call's chunks returned in a form of its own, its
``emit``: the daemon's are the slab leases that hold them), never through
exceptions: the host decides where each goes. Each notice that
answers a request carries that request's ``seq``. The one exception:
:class:`~rte.errors.EngineFault` (the engine's device failed for good) ends
the loop, so its host fails closed instead of serving errors.

A session may be parked (:mod:`rte.parking`): suspended by its client, or
idle past ``park_idle_s``; it stays attached, its state in host memory, and its
step boundary is where it comes back. A session that moves (an export, a
checkpoint) takes what the loop keeps for it along (:class:`~rte.state.HostHalf`:
its class, queued actions, receipts, whether it was suspended); the loop it
moves into restores it, so a queued action applies at the chunk it would have.

Run it on the thread that will step the engine for its whole life (CUDA
streams are per-thread): ``threading.Thread(target=default_serve, ...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rte.contract import Action, Engine, Notice, NoticeKind
from rte.delivery import Delivery, Emit, OutboxItem
from rte.errors import AdmissionError, EngineFault, RequestError, StateError, UnknownSessionError
from rte.overload import DEFAULT_PRIORITY, check_priority
from rte.parking import DEFAULT_PARK_BYTES, Parking
from rte.pending import PendingActions
from rte.protocol.requests import (
    Act,
    Attach,
    Detach,
    Export,
    Reset,
    Resume,
    Stop,
    Suspend,
    Wake,
    carried_state,
)
from rte.queues import Inbox, Outbox, drain, put_all
from rte.realtime import DEFAULT_MARGIN
from rte.receipts import Receipts
from rte.state import HostHalf, SessionState
from rte.turns import Turns

__all__ = ["Emit", "Inbox", "Outbox", "OutboxItem", "ServeLoop", "default_serve"]


def default_serve(
    engine: Engine,
    inbox: Inbox,
    outbox: Outbox,
    *,
    pace_hz: float | None = None,
    idle_wait_s: float = 0.05,
    due: Callable[[list[str]], list[str]] | None = None,
    admission: str = "realtime",
    margin: float = DEFAULT_MARGIN,
    park_bytes: int = DEFAULT_PARK_BYTES,
    park_idle_s: float = 0.0,
) -> None:
    """Serve ``engine`` until a :class:`Stop` arrives.

    Args:
        pace_hz: target steps per second; None steps as fast as possible.
        idle_wait_s: how long one inbox wait lasts while no session is due.
        due: picks, from the attached sessions, those to step this turn (a
            host's backpressure: a consumer that has not caught up); default all.
            A host that makes sessions due again puts :class:`Wake` in the inbox.
        admission, margin, park_bytes, park_idle_s: see :class:`ServeLoop`.
    """
    loop = ServeLoop(
        engine,
        pace_hz=pace_hz or 0.0,
        admission=admission,
        margin=margin,
        park_bytes=park_bytes,
        park_idle_s=park_idle_s,
    )
    pick = due or (lambda sessions: sessions)
    while True:
        block = not pick(loop.sessions)
        if not block:
            loop.begin_turn()
        messages = drain(inbox, block=block, timeout=idle_wait_s)
        if block:  # the wait for a message is no part of the turn's cost
            loop.begin_turn()
        for message in messages:
            if isinstance(message, Stop):
                put_all(outbox, loop.stop())
                return
            put_all(outbox, loop.handle(message))
        put_all(outbox, loop.step(pick(loop.sessions)))
        put_all(outbox, loop.park_idle())
        loop.end_turn()
        if loop.pacer is not None:
            loop.pacer.wait()


class ServeLoop:
    """Steps 2 to 4 of the loop, for any host (default_serve, the daemon).

    ``handle`` applies one message, ``step`` advances the due sessions, and
    both return what came of it; neither raises for anything a sender did.

    Args:
        engine: the engine it steps.
        pace_hz: the host's pace (0: unpaced); a paced loop has a :attr:`pacer`.
        admission: ``realtime`` (a paced loop refuses an attach past its real-time
            capacity) or ``rows`` (only the engine's rows limit admission).
        margin: the share of the period a turn's predicted cost must leave free.
        stamp: whether results carry ``applied`` (the daemon reads :attr:`receipts`).
        emit: what stands for an engine call's chunks in what the loop returns, made
            from that call's results (default: the CHUNK results; the daemon's: the
            slab leases that hold them, a chunk's one object to its STEP record),
            with how many chunks they hold.
        park_bytes: the most bytes of parked sessions' states held (0: none parked).
        park_idle_s: park a session not due for this long (0: never by idleness).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        pace_hz: float = 0.0,
        admission: str = "realtime",
        margin: float = DEFAULT_MARGIN,
        stamp: bool = True,
        emit: Emit | None = None,
        park_bytes: int = DEFAULT_PARK_BYTES,
        park_idle_s: float = 0.0,
    ) -> None:
        self.engine = engine
        self.parking = Parking(engine, park_bytes, park_idle_s)
        self.conditioning: dict[str, dict[str, Any]] = {}  # attached sessions, in order
        self.pending = PendingActions()
        manifest = engine.manifest()
        self.turns = Turns(pace_hz, manifest.max_sessions, admission, margin)
        turns = self.turns  # its parts a host reads (the pace, the figures it publishes)
        self.realtime, self.pacer, self.governor = turns.realtime, turns.pacer, turns.governor
        self.receipts = Receipts(manifest.pipelined)
        let_go = self._let_go  # step 4 (rte.delivery): results made outbox items
        self._emitted = Delivery(self.receipts, stamp, emit, let_go)

    @property
    def sessions(self) -> list[str]:
        """The attached sessions, in the order they came."""
        return list(self.conditioning)

    # -- turns: what real time is measured by ------------------------------

    def begin_turn(self) -> None:
        """A host's turn begins (:meth:`rte.turns.Turns.begin`)."""
        self.turns.begin()

    def end_turn(self) -> None:
        """The turn (drain, step, deliver) is over (:meth:`rte.turns.Turns.end`)."""
        self.turns.end()

    def capacity(self) -> int | None:
        """Sessions this loop's pace holds in real time (None: unpaced or not known yet)."""
        return self.turns.capacity()

    def handle(self, message: object) -> list[OutboxItem]:
        """Apply one request; the notices (and finalized chunks) it produced."""
        session = getattr(message, "session", "")
        seq = getattr(message, "seq", 0)
        out: list[OutboxItem] = []
        try:
            match message:
                case Attach():
                    priority = check_priority(message.priority)
                    self._attach(message.session, message.conditioning, seq, out, priority)
                case Act():
                    self._act(message.session, message.action, seq, out)
                case Detach():
                    self._require(message.session)
                    self.detach(message.session, finalize=message.finalize, seq=seq, out=out)
                case Reset():
                    self._reset(message, out)
                case Suspend():
                    self._require(message.session)
                    self.parking.park(message.session, asked=True)
                    out.append(Notice(session, NoticeKind.SUSPENDED, "", seq))
                case Resume():
                    self._resume(message.session, seq, out)
                case Export():  # its state handed over, then it leaves (no row to leave)
                    host = self.host_state(session)  # (its queued actions, receipts, class)
                    nbytes = self.parking.export(session, message.into, host)
                    self.detach(session, seq=seq, out=out)
                    out.append(Notice(session, NoticeKind.EXPORTED, str(nbytes), seq))
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
        news: list[OutboxItem] = [*self.turns.news()]
        due = self.parking.take_due(self.sessions if due is None else due, news)
        due = self.turns.pick(due)  # overload: reduced classes step every k-th tick
        if not due:
            return news
        self.receipts.settle()
        actions, seqs = self.pending.take(due)
        try:
            results = self.engine.step(due, actions)
        except EngineFault:
            raise
        except Exception as exc:
            return [Notice("", NoticeKind.ERROR, f"step failed: {type(exc).__name__}: {exc}")]
        self.turns.stepped += len(due)
        if seqs:
            self.receipts.handed(results, seqs)
        return self._emitted(results) + news

    def park_idle(self) -> list[OutboxItem]:
        """Park the sessions not due for ``park_idle_s`` (SUSPENDED notices saying so)."""
        return list(self.parking.park_idle(self.sessions))

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
        if self.parking.drop(session):  # parked: its state goes, no row to leave
            self._forget(session)
            out.append(Notice(session, NoticeKind.DETACHED, reason, seq))
            return out
        if finalize:
            try:
                out += self._emitted(self.engine.finalize([session]))  # stamped, then forgotten
            except EngineFault:
                raise
            except Exception as exc:  # its in-flight chunk is lost; the detach still goes on
                out.append(Notice(session, NoticeKind.DROPPED, f"in-flight chunk lost: {exc}"))
        self.engine.detach(session)
        self._forget(session)
        out.append(Notice(session, NoticeKind.DETACHED, reason, seq))
        return out

    def host_state(self, session: str) -> dict[str, Any]:
        """What this loop keeps for an attached ``session`` beside its engine state
        (its priority, the actions queued for its next step and their seq, its
        receipts): the ``host`` of an exported or checkpointed
        :class:`~rte.state.SessionState` (:class:`~rte.state.HostHalf`)."""
        self._require(session)
        actions, seq = self.pending.of(session)
        priority = self.governor.priority.get(session, DEFAULT_PRIORITY)
        applied, marks = self.receipts.of(session)
        asked = self.parking.asked(session)
        return HostHalf(priority, actions, seq, applied, marks, asked).to_value()

    def _forget(self, session: str) -> None:
        del self.conditioning[session]
        self.pending.forget(session)
        self.receipts.forget(session)
        self.governor.remove(session)

    # -- requests ---------------------------------------------------------

    def _attach(
        self,
        session: str,
        conditioning: Mapping[str, Any],
        seq: int,
        out: list[OutboxItem],
        priority: int = DEFAULT_PRIORITY,
        *,
        admit: bool = True,
    ) -> None:
        if not session:
            raise ValueError('the session id "" is reserved (notices about the whole engine)')
        new = session not in self.conditioning
        if new and admit:  # AdmissionError past real time (parked sessions take no time)
            self.realtime.admit(len(self.conditioning) - len(self.parking.parked))
        state = carried_state(conditioning)  # moved in with its state (exported, checkpointed)
        host = None
        if state is not None and new:
            host = self._move_in(session, state)
            conditioning = state.conditioning
            if priority == DEFAULT_PRIORITY and host.priority is not None:
                priority = host.priority  # (an attach naming another class: its own)
        elif session not in self.parking:  # (parked: attached already)
            self.engine.attach(session, conditioning)
        if new:
            self.conditioning[session] = dict(conditioning)
        if host is not None:  # what was queued applies at its next step, as it would have
            if host.actions:
                self.pending.put(session, host.actions, host.act_seq)
                self.conditioning[session].update(host.actions)
            self.receipts.restore(session, host.applied, host.marks)
        out.append(Notice(session, NoticeKind.ATTACHED, "", seq))
        out += self.governor.add(session, priority)  # joining a reduced class: told so
        if host is not None and host.suspended:
            self._park_moved(session, out)

    def _move_in(self, session: str, state: SessionState) -> HostHalf:
        """Resume ``session`` from ``state`` moved in; its host half, checked. A
        StateError (naming the field) loads nothing."""
        host = HostHalf.of(state.host, session)
        if not self.parking.can_park:
            raise StateError(f"session {session!r} cannot move in: this model takes no state")
        engine: Any = self.engine  # resume: past the Engine protocol, as parking's
        engine.resume(session, state)
        try:
            self._check(session, host.actions)  # (a row to check them against now)
        except (ValueError, TypeError) as exc:
            engine.detach(session)  # nothing loaded
            raise StateError(
                f"session {session!r} cannot move in: its state's host.actions are refused: {exc}"
            ) from None
        return host

    def _park_moved(self, session: str, out: list[OutboxItem]) -> None:
        """``session`` moved in suspended by its client: parked again (news, seq 0),
        or, past this host's park budget, told it streams."""
        try:
            self.parking.park(session, asked=True)
        except AdmissionError as exc:
            out.append(Notice(session, NoticeKind.RESUMED, f"moved in suspended, but {exc}"))
            return
        why = "moved in suspended, as it left: resume it to stream"
        out.append(Notice(session, NoticeKind.SUSPENDED, why))

    def _act(self, session: str, action: Action, seq: int, out: list[OutboxItem]) -> None:
        self._require(session)
        if self.parking.asked(session):
            raise RequestError(f"session {session!r} is suspended: resume it before acting on it")
        if session not in self.parking or self._resume(session, 0, out, quiet=True):
            self._check(session, action.conditioning)  # (no row: checked at its step)
        self.pending.put(session, action.conditioning, seq)
        self.conditioning[session].update(action.conditioning)

    def _resume(self, session: str, seq: int, out: list[OutboxItem], quiet: bool = False) -> bool:
        if session not in self.parking:
            self._require(session)
        return self.parking.bring_back(session, seq, out, quiet=quiet)

    def _reset(self, message: Reset, out: list[OutboxItem]) -> None:
        session = message.session
        self._require(session)
        fresh = message.conditioning
        if fresh is not None:
            self._check(session, fresh)  # refuse before anything changes
        keep = dict(self.conditioning[session] if fresh is None else fresh)
        priority = self.governor.priority.get(session, DEFAULT_PRIORITY)
        self.detach(session, finalize=message.finalize, seq=message.seq, out=out)
        self._attach(session, keep, message.seq, out, priority, admit=False)  # it had a place

    def _check(self, session: str, conditioning: Mapping[str, Any]) -> None:
        """Refuse malformed conditioning now, not at the session's next step."""
        check = getattr(self.engine, "check_action", None)
        if check is not None:
            check(session, Action(conditioning))

    def _let_go(self, session: str, reason: str, out: list[OutboxItem]) -> None:
        self.detach(session, finalize=False, reason=reason, out=out)

    def _require(self, session: str) -> None:
        if session not in self.conditioning:
            raise UnknownSessionError(f"session {session!r} is not attached")
