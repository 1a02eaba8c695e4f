"""Moves in flight: many sessions' moves between a pool's daemons made at once,
none waiting for another, and nothing here waiting at all.

A move is two requests (:mod:`rte.client.migration`): an EXPORT to the
session's daemon, then, once its EXPORTED answer came, an ATTACH with that
state pinned to the targets (and, if every target refused it, one more pinned
to the daemon it came from). Each answer comes at its daemon's next turn, so
a drain made one move after another costs two turns per session and its last
session waits for all the others. :class:`MovesInFlight` instead sends every
move's export at once (one request each, matched to its answer by its seq, as
any call is: :meth:`ClientCore.expect`), and each move's attach as soon as its
export is answered: a drain of N sessions costs what one move costs.

It never waits and never receives: its owner (the sync client's
``poll``/``drain``, the asyncio client's) pumps the transport as it always
does, which sorts the answers into the core, then calls :meth:`advance`, which
takes the answers that came, sends each move's next request and returns the
moves that ended. So it is never entered from inside a receive, and the
owner's other sessions' chunks are handed out and released meanwhile. An
action sent to a session in flight is held (:meth:`hold`) and sent once the
session landed, where it landed: none is refused for arriving mid-move.

A move whose export is given up on (no answer in its time) ends with its
RequestTimeout, and its export is the client's
:class:`~rte.client.transport.LateExports`' (its slot kept lent; carried out
late, its session is attached again where it was): it is never lost. One whose
attach is given up on (sent back where it came from) leaves no second copy
where that attach is taken up late
(:class:`~rte.client.late_attaches.LateAttaches`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rte.client.core import Call, ClientCore
from rte.client.late_attaches import LateAttaches
from rte.errors import RequestTimeout, RteError
from rte.overload import DEFAULT_PRIORITY
from rte.protocol.requests import Act, Attach, Export, Request
from rte.state import SessionState

if TYPE_CHECKING:
    from rte.client.migration import Move


class MovingTransport(Protocol):
    """What a move needs of its client's transport: a pool's
    (:class:`~rte.client.pool.PoolTransport`) or Ray's
    (:class:`~rte.ray.transport.RayTransport`)."""

    home: Any  # session -> the daemon it lives on (``.get``)
    pinned: dict[str, list[str]]  # session -> the daemons its attach may go to

    def export_into(self, request: Export, timeout: float) -> Export: ...
    def exported(self, request: Export, nbytes: int) -> SessionState: ...
    def export_done(self, request: Export) -> None: ...
    def lend(self, request: Request, timeout: float) -> Request: ...
    def unlend(self, request: Request) -> None: ...
    def send(self, request: Request, room_s: float = 0.0) -> None: ...


def fly(
    core: ClientCore,
    pool: MovingTransport,
    pump: Callable[[float], None],
    moves: list[Move],
    timeout: float,
) -> list[Landed]:
    """Make ``moves`` at once, for a client that blocks: ``pump(s)`` waits up to
    ``s`` seconds for something and sorts it into ``core``; each move's end."""
    flights = MovesInFlight(core, pool, timeout)
    for move in moves:
        flights.start(move, timeout)
    landed = flights.advance()
    while flights:
        pump(flights.wait_s())
        landed += flights.advance()
    return landed


@dataclass
class Flight:
    """One session's move on its way: the request it waits on now."""

    move: Move
    request: Call
    timeout: float
    deadline: float
    tag: Any = None  # the owner's (a drain's held-back notice)
    state: SessionState | None = None  # exported: its state
    refused: RteError | None = None  # every target refused it: going back to move.old
    held: list[Act] = field(default_factory=list)  # actions sent meanwhile


@dataclass(frozen=True)
class Landed:
    """A move that ended: ``to`` the daemon it is on now, or ``error`` as
    :meth:`Migrating.migrate` raises it (the session back where it was, or
    stranded: a :class:`~rte.client.migration.MigrationError` holding its state)."""

    move: Move
    to: str
    error: RteError | None
    tag: Any
    held: list[Act]


class MovesInFlight:
    """The moves of one client in flight; see the module.

    Args:
        core: the client's core (numbering, answers).
        pool: the client's pool transport.
        room_s: how long a send may wait for room in a request ring or an input
            slot (0 on an event loop: a full ring fails that step of the move).
    """

    def __init__(self, core: ClientCore, pool: MovingTransport, room_s: float) -> None:
        self._core, self._pool, self._room_s = core, pool, room_s
        self._flights: dict[str, Flight] = {}  # session -> its move
        self._landed: list[Landed] = []
        self._queued: list[tuple[Move, float, Any]] = []  # no input slot free yet
        self._held_queued: dict[str, list[Act]] = {}  # actions sent to a queued one

    def __bool__(self) -> bool:
        return bool(self._flights or self._landed or self._queued)

    def __contains__(self, session: object) -> bool:
        return session in self._flights or any(m.session == session for m, _, _ in self._queued)

    def start(self, move: Move, timeout: float, tag: Any = None) -> None:
        """Send ``move``'s export (each of its requests waits ``timeout`` s for its
        answer); a refused send ends the move at once. With no input slot free
        for its state while other exports hold theirs, it waits (queued) for
        theirs to come back."""
        core, pool = self._core, self._pool
        late = core.late
        if late is not None and move.session in late:  # (tried again once that ended)
            late.by_session[move.session].held += self._held_queued.pop(move.session, [])
            self._landed.append(Landed(move, "", late.busy(move.session), tag, []))
            return
        exporting = any(isinstance(f.request, Export) for f in self._flights.values())
        room_s = 0.0 if exporting else self._room_s
        try:
            request = pool.export_into(core.export(move.session), room_s)
        except RteError as why:
            if exporting and isinstance(why, RequestTimeout):
                self._queued.append((move, timeout, tag))
                return
            held = self._held_queued.pop(move.session, [])
            self._landed.append(Landed(move, "", why, tag, held))
            return
        flight = Flight(move, request, timeout, 0.0, tag)
        flight.held = self._held_queued.pop(move.session, [])
        self._flights[move.session] = flight
        refused = self._send(flight, request)
        if refused is not None:
            del self._flights[move.session]
            pool.export_done(request)
            self._landed.append(Landed(move, "", refused, tag, flight.held))

    def hold(self, act: Act) -> bool:
        """Keep ``act`` for its session's landing if it is in flight (True)."""
        flight = self._flights.get(act.session)
        if flight is None:
            if act.session not in self:
                return False
            self._held_queued.setdefault(act.session, []).append(act)
            return True
        flight.held.append(act)
        return True

    def ready(self) -> bool:
        """Whether :meth:`advance` has something to do now (an answer came, a
        deadline passed, a move ended)."""
        if self._landed:
            return True
        now, core = time.monotonic(), self._core
        flights = self._flights.values()
        if self._queued and not any(isinstance(f.request, Export) for f in flights):
            return True  # waiting for an input slot, and no export will give one back
        return any(core.answered(f.request.seq) or f.deadline <= now for f in flights)

    def wait_s(self) -> float:
        """Seconds until the nearest deadline (0: :meth:`advance` now)."""
        if self._landed or not self._flights:
            return 0.0
        nearest = min(f.deadline for f in self._flights.values())
        return max(0.0, nearest - time.monotonic())

    def advance(self) -> list[Landed]:
        """Take the answers that came, send each move's next request; the moves
        that ended (in the order they ended)."""
        core, now = self._core, time.monotonic()
        for flight in list(self._flights.values()):
            seq = flight.request.seq
            if core.answered(seq):
                core.forget(seq)
                try:
                    answer = core.answer(seq)
                except RteError as why:
                    self._failed(flight, why)
                else:
                    self._answered(flight, int(answer.message or 0))
            elif flight.deadline <= now:
                core.forget(seq)
                request = flight.request
                if isinstance(request, Export) and core.late is not None:  # (its slot kept)
                    late = core.late.give_up(request, flight.move.old, flight.timeout)
                    late.held, flight.held = flight.held, []  # (sent where it is attached again)
                    self._end(flight, error=late.error)
                else:
                    lates = self._lates()
                    if lates is not None and isinstance(request, Attach):  # (still on its way)
                        lates.add(request.seq, request.session)
                    self._failed(flight, core.unanswered(request, flight.timeout))
        queued, self._queued = self._queued, []
        for move, timeout, tag in queued:  # (slots came back: those waiting go now)
            self.start(move, timeout, tag)
        landed, self._landed = self._landed, []
        return landed

    # -- a move's steps ----------------------------------------------------------

    def _answered(self, flight: Flight, nbytes: int) -> None:
        move, pool = flight.move, self._pool
        if isinstance(flight.request, Export):
            try:
                flight.state = pool.exported(flight.request, nbytes)
            except RteError as why:
                return self._end(flight, error=why)
            finally:
                pool.export_done(flight.request)
            return self._attach(flight, move.targets)
        pool.pinned.pop(move.session, None)
        if flight.refused is None:
            return self._end(flight, to=pool.home.get(move.session, ""))
        back = move.back(flight.refused)
        back.__cause__ = flight.refused
        self._end(flight, to=pool.home.get(move.session, ""), error=back)

    def _failed(self, flight: Flight, why: RteError) -> None:
        move, pool = flight.move, self._pool
        state = flight.state
        if state is None:  # its export: the session stays as it was
            if isinstance(flight.request, Export):
                pool.export_done(flight.request)
            return self._end(flight, error=why)
        pool.pinned.pop(move.session, None)
        if flight.refused is None:  # every target refused it: back where it came from
            flight.refused = why
            return self._attach(flight, [move.old])
        stranded = move.stranded(state, flight.refused, why)
        stranded.__cause__ = flight.refused
        lates = self._lates()
        if lates is not None:  # (an attach of it given up on, carried out late: its home)
            lates.stranded_now(move.session)
        self._end(flight, error=stranded)

    def _attach(self, flight: Flight, names: list[str]) -> None:
        """Send the attach with the state, pinned to ``names`` (in order)."""
        assert flight.state is not None
        session, pool = flight.move.session, self._pool
        try:
            request = self._core.attach(session, None, 0, DEFAULT_PRIORITY, flight.state)
        except RteError as why:  # (closed meanwhile): the state is the caller's
            return self._end(flight, error=flight.move.stranded(flight.state, why, why))
        pool.pinned[session] = names
        refused = self._send(flight, request)
        if refused is not None:
            self._failed(flight, refused)

    def _send(self, flight: Flight, request: Call) -> RteError | None:
        """Send ``request`` as ``flight``'s next; why it could not be sent, if not
        (what it was lent given back)."""
        core, pool = self._core, self._pool
        flight.request = request
        core.expect(request)
        try:
            lent = pool.lend(request, self._room_s)
        except RteError as why:
            core.forget(request.seq)
            return why
        try:
            pool.send(lent, self._room_s)
        except RteError as why:
            core.forget(request.seq)
            pool.unlend(lent)
            return why
        flight.deadline = time.monotonic() + flight.timeout
        return None

    def _lates(self) -> LateAttaches | None:
        return getattr(self._pool, "late_attaches", None)  # (a pool's; Ray's keeps none)

    def _end(self, flight: Flight, to: str = "", error: RteError | None = None) -> None:
        del self._flights[flight.move.session]
        self._landed.append(Landed(flight.move, to, error, flight.tag, flight.held))
