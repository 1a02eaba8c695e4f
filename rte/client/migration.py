"""Moving a pool's sessions between its daemons: migrate one, drain a daemon, and
go along with a daemon-wide drain.

    with connect_pool(["gpu-0", "gpu-1"]) as client:
        client.attach("alice", {"prompt": "a forest"})
        client.migrate("alice", to="gpu-1")   # goes on there, at its next chunk
        client.drain("gpu-0")                 # every session of this client leaves gpu-0

A move is the two halves the clients already have, through the session's own
pool: :meth:`~rte.client.base.EngineClient.export` on its daemon (the session
is suspended at a chunk boundary, detached, and its state written into this
client's input segment, never the ring), then an attach with that state on
the target, pinned there (:attr:`PoolTransport.pinned` restricts the pool's
placement to the targets, in order; an attach refused by one goes to the
next). The daemon's outbox ring is ordered, so every chunk the session emitted
before its export reached the client before the EXPORTED answer did: they are
handed out first, then the target's, whose indices go on from the next chunk
(no gap, no repeat; a deterministic model's frames are a never-moved twin's).

The state is never lost: when every target refuses it, it is attached back on
the daemon it came from (its row was just freed there); when that fails too,
the :class:`MigrationError` holds the state for the caller to attach anywhere.
The client sees one stall: the export's round trip plus the attach's, a couple
of the pace's periods (``tests/test_migrate.py`` prints it). A drain costs the
same: its moves are made at once (:class:`~rte.client.in_flight.MovesInFlight`:
every export sent together, each attach as soon as its export is answered),
not one after another.

**A daemon-wide drain** (``rte drain NAME``, :mod:`rte.ipc.draining`) tells
each client, with a DRAINING notice per session, that its session is to move.
A pool never moves it from inside a receive: the pool holds the notice back
(:class:`DrainMoves`) and the client moves the session at its next safe point,
the entry of ``poll``, ``poll_batch``, ``results`` or ``notices`` (the asyncio
client's ``poll``, ``poll_batch`` and ``results``), as :meth:`Migrating.drain`
would: to the pool's other live daemons, most free rows first. Those calls
never wait for the moves: they send them and take their answers as they come,
handing out the client's other sessions' chunks meanwhile (an action sent to a
session on its way is held and sent where it lands). The DRAINING
notice then surfaces among :meth:`notices`, its message saying where the
session went (``... moved to 'gpu-1'``), or why it could not move: it stays
where it is and the move is tried again every :data:`MOVE_RETRY_S` while its
daemon still holds it. A session whose state every daemon refused is attached
nowhere; its state is kept in :attr:`Migrating.stranded` and an ERROR notice
says so. A plain (single daemon) client cannot move: it only sees the notice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rte.client import arguments
from rte.client.base import EngineClient
from rte.client.batch import ChunkBatch
from rte.client.core import Chunk, ClientCore
from rte.client.in_flight import Landed, MovesInFlight, fly
from rte.client.transport import send_held
from rte.contract import Notice, NoticeKind
from rte.errors import AdmissionError, EngineGone, RequestError, RteError, UnknownSessionError
from rte.state import SessionState

if TYPE_CHECKING:
    from rte.client.pool import PoolTransport

MOVE_RETRY_S = 1.0  # a drained session that could not move is tried again this often
# how long each request of a drain's move waits for its answer. An export given up on
# loses nothing (carried out late, its session is attached again where it was:
# rte.client.transport.LateExports), but it costs that round trip and a retry, and a
# drain is for a restart: no hurry
DRAIN_MOVE_S = 30.0


class MigrationError(AdmissionError):
    """A move was refused by every target and by the daemon it came from: the
    session is attached nowhere, and its exported state is :attr:`state` (attach
    it with ``attach(session, state=error.state)`` once there is room)."""

    def __init__(self, message: str, state: SessionState) -> None:
        super().__init__(message)
        self.state = state


@dataclass(frozen=True)
class Move:
    """One session's move, checked: from ``old`` to the first of ``targets`` that
    takes it (both client forms run it: export, attach there, else back)."""

    session: str
    old: str
    targets: list[str]

    @classmethod
    def of(
        cls, pool: PoolTransport, sessions: set[str], session: str, to: str | Sequence[str]
    ) -> Move:
        """UnknownSessionError for a session not attached, RequestError for a target
        not of this pool or its own daemon, EngineGone when no target is live."""
        old = pool.home.get(session)
        if old is None or session not in sessions:
            raise UnknownSessionError(f"session {session!r} is not attached to pool {pool.name!r}")
        targets = [to] if isinstance(to, str) else list(to)
        for name in targets:
            if name not in pool.members:
                raise RequestError(f"{name!r} is not a daemon of pool {pool.name!r}")
            if name == old:
                raise RequestError(f"session {session!r} lives on {name!r} already")
        if not any(name in pool.live() for name in targets):
            raise EngineGone(f"no daemon of {targets} is live: {session!r} stays on {old!r}")
        return cls(session, old, targets)

    def back(self, refused: RteError) -> AdmissionError:
        """Every target refused it; it is attached back where it was."""
        return AdmissionError(
            f"moving {self.session!r} to {self.targets}: {refused}; it is back on "
            f"{self.old!r}, going on"
        )

    def stranded(self, state: SessionState, refused: RteError, also: RteError) -> MigrationError:
        """Every target refused it, and so did its old daemon."""
        return MigrationError(
            f"moving {self.session!r}: refused by {self.targets} ({refused}) and by "
            f"{self.old!r} it came from ({also}); attach it with state=error.state",
            state,
        )


def drain_targets(pool: PoolTransport, name: str) -> list[str]:
    """Where the sessions of daemon ``name`` go: the pool's other live daemons,
    most free rows first (draining ones last). RequestError for a daemon not of
    the pool, EngineGone when no other is live."""
    return spread(pool, name, 1)[0]


def spread(pool: PoolTransport, name: str, count: int) -> list[list[str]]:
    """The targets of ``count`` sessions of daemon ``name`` moved at once, each as
    :func:`drain_targets` orders them, as if those before it had taken a row
    each where they go first (so the moves spread: fewer refused). The errors
    of :func:`drain_targets`."""
    if name not in pool.members:
        raise RequestError(f"{name!r} is not a daemon of pool {pool.name!r}")
    free = {n: pool.free_rows(n) for n in pool.live() if n != name}
    if not free:
        raise EngineGone(f"draining {name!r}: no other daemon of the pool is live")
    out: list[list[str]] = []
    for _ in range(count):
        order = sorted(free, key=lambda n: free[n], reverse=True)
        order.sort(key=pool.placer.draining)  # (stable: the free rows' order kept)
        free[order[0]] -= 1
        out.append(order)
    return out


@dataclass
class Told:
    """A DRAINING notice held back until its session moves (or cannot)."""

    name: str  # the draining daemon
    notice: Notice
    not_before: float = 0.0
    tries: int = 0


class DrainMoves:
    """The DRAINING notices a pool held back: each session's move, due at the
    client's next safe point (see the module)."""

    def __init__(self) -> None:
        self._told: dict[str, Told] = {}

    def __bool__(self) -> bool:
        return bool(self._told)

    def __len__(self) -> int:
        return len(self._told)

    def add(self, name: str, notice: Notice) -> None:
        """Daemon ``name`` drains: ``notice``'s session is to move."""
        self._told[notice.session] = Told(name, notice)

    def due(self) -> list[Told]:
        """The moves to make now (no longer held: :meth:`after` puts a failed one back)."""
        now = time.monotonic()
        due = [told for told in self._told.values() if told.not_before <= now]
        for told in due:
            del self._told[told.notice.session]
        return due

    @staticmethod
    def stale(told: Told, pool: PoolTransport, sessions: set[str]) -> bool:
        """Whether ``told``'s session left its draining daemon meanwhile (detached,
        lost, moved by the caller): its notice goes out as it came."""
        session = told.notice.session
        return pool.home.get(session) != told.name or session not in sessions

    def after(self, told: Told, to: str = "", error: RteError | None = None) -> Notice | None:
        """The notice the caller sees once ``told``'s move went ``to`` a daemon, or
        failed for ``error``: a :class:`MigrationError` (its state is the caller's,
        in ``stranded``), or any other (tried again every :data:`MOVE_RETRY_S`;
        None: told so already, at its first failure)."""
        session, said = told.notice.session, told.notice.message
        if error is None:
            return Notice(session, NoticeKind.DRAINING, f"{said}: moved to {to!r}")
        if isinstance(error, MigrationError):
            text = f"{error}; its state is client.stranded[{session!r}] ({told.name!r} drains)"
            return Notice(session, NoticeKind.ERROR, text)
        told.tries += 1
        told.not_before = time.monotonic() + MOVE_RETRY_S
        self._told[session] = told
        if told.tries > 1:
            return None
        text = f"{said}: could not move ({error}); tried again every {MOVE_RETRY_S:g}s"
        return Notice(session, NoticeKind.DRAINING, text)

    def landed(self, landed: Landed, stranded: dict[str, SessionState]) -> Notice | None:
        """:meth:`after` for a move of :class:`MovesInFlight` that ended (its tag a
        :class:`Told`); a state every daemon refused goes into ``stranded``."""
        told, error = landed.tag, landed.error
        if error is None:
            return self.after(told, landed.to)
        if isinstance(error, MigrationError):
            stranded[told.notice.session] = error.state
        return self.after(told, error=error)


def drain_moves(pool: PoolTransport, sessions: set[str], name: str) -> list[Move]:
    """The moves of every session of ``sessions`` on daemon ``name`` (spread over
    the others); RequestError for a daemon not of the pool, EngineGone when no
    other is live (checked before any move)."""
    mine = sorted(s for s in sessions if pool.home.get(s) == name)
    targets = spread(pool, name, max(1, len(mine)))
    return [Move.of(pool, sessions, s, to) for s, to in zip(mine, targets, strict=False)]


def outcome(landed: list[Landed]) -> dict[str, str]:
    """session -> where it went, of moves that all ended; the error of the first
    (by session) that did not move, once all have ended (the others moved)."""
    failed = sorted((m for m in landed if m.error is not None), key=lambda m: m.move.session)
    if failed:
        assert failed[0].error is not None
        raise failed[0].error
    return {m.move.session: m.to for m in landed}


def start_due(
    moves: DrainMoves,
    flights: MovesInFlight,
    pool: PoolTransport,
    sessions: set[str],
    timeout: float,
) -> list[Notice]:
    """Start the move of every held-back session now due (spread over the other
    daemons); the notices to hand out at once (a stale one, one that cannot
    start)."""
    news: list[Notice] = []
    by_daemon: dict[str, list[Told]] = {}
    for told in moves.due():
        if told.notice.session in flights:  # (told again while on its way: as it came)
            news.append(told.notice)
        elif moves.stale(told, pool, sessions):  # (told already: not again)
            news += [] if told.tries else [told.notice]
        else:
            by_daemon.setdefault(told.name, []).append(told)
    for name, told_here in by_daemon.items():
        try:
            targets = spread(pool, name, len(told_here))
        except RteError as why:
            news += [n for t in told_here if (n := moves.after(t, error=why)) is not None]
            continue
        for told, to in zip(told_here, targets, strict=True):
            try:
                flights.start(Move.of(pool, sessions, told.notice.session, to), timeout, told)
            except RteError as why:
                if (notice := moves.after(told, error=why)) is not None:
                    news.append(notice)
    return news


def advance_drained(
    core: ClientCore,
    pool: PoolTransport,
    flights: MovesInFlight,
    stranded: dict[str, SessionState],
    timeout: float,
    room_s: float,
) -> dict[str, str]:
    """Both clients' ``move_drained``: start the held-back moves now due, take those
    that ended (their notices into ``core``, a state every daemon refused into
    ``stranded``) and send what was held for them (waiting ``room_s`` for room);
    session -> where it went, of those that landed now."""
    core.sort([*start_due(pool.moves, flights, pool, core.sessions, timeout)])
    moved: dict[str, str] = {}
    for landed in flights.advance():
        news = pool.moves.landed(landed, stranded)
        core.sort([] if news is None else [news])
        if landed.error is None:
            moved[landed.move.session] = landed.to
        send_held(core, pool, landed.held, room_s)  # (the session's own, where it is now)
    return moved


class Migrating(EngineClient):
    """:meth:`migrate` and :meth:`drain` for a client over a :class:`PoolTransport`,
    and its moves when a daemon drains (see the module).

    Attributes:
        stranded: (:class:`EngineClient`'s) session -> its state, for a drained
            session every daemon refused too (attached nowhere:
            ``attach(s, state=client.stranded.pop(s))``).
    """

    transport: PoolTransport
    _moving: bool
    _drained: MovesInFlight  # the moves of sessions whose daemon drains, on their way

    def migrate(self, session: str, to: str | Sequence[str], *, timeout: float = 5.0) -> str:
        """Move ``session`` to daemon ``to`` (or the first of several that takes it);
        the daemon it went to. AdmissionError when every target refuses it (it is
        attached back where it was, going on; :class:`MigrationError` if even that
        failed), RequestError for a target not of this pool or its own daemon,
        UnknownSessionError for a session not attached."""
        move = Move.of(self.transport, self.sessions, session, to)
        return outcome(self._fly([move], timeout))[session]

    def drain(self, name: str, *, timeout: float = 5.0) -> dict[str, str]:
        """Move every session of this client on daemon ``name`` to the pool's other
        live daemons (most free rows first), all at once (:mod:`rte.client.in_flight`:
        what one move costs); session -> where it went. One that cannot move raises
        as :meth:`migrate` does, once every move ended (the others moved)."""
        return outcome(self._fly(drain_moves(self.transport, self.sessions, name), timeout))

    def _fly(self, moves: list[Move], timeout: float) -> list[Landed]:
        """Make ``moves`` at once, waiting (receiving) until each ended (and, first,
        until an export of theirs given up on earlier ended)."""
        timeout = arguments.timeout(timeout)
        deadline = time.monotonic() + timeout
        for move in moves:
            self._after_late(move.session, deadline, timeout)
        return fly(self._core, self.transport, self._pump, moves, timeout)

    # -- a daemon drains: the moves, at the safe points -------------------------

    def act(self, session: str, conditioning: Mapping[str, Any], *, timeout: float = 1.0) -> int:
        if session in self._drained:  # on its way: sent where it lands
            request = self._core.act(session, conditioning)
            self._drained.hold(request)
            return request.seq
        return super().act(session, conditioning, timeout=timeout)

    def poll(self, timeout: float = 1.0) -> Chunk | None:
        if self.transport.moves or self._drained:
            timeout = self._follow_drain(timeout)
        return super().poll(timeout)

    def poll_batch(self, timeout: float = 1.0) -> ChunkBatch | None:
        if self.transport.moves or self._drained:
            timeout = self._follow_drain(timeout)
        return super().poll_batch(timeout)

    def notices(self) -> list[Notice]:
        news = super().notices()  # (what came, a DRAINING among it, is held by the pool)
        if self.transport.moves or self._drained:
            self.move_drained()
            news += self._core.drain_notices()
        return news

    def move_drained(self, *, timeout: float = DRAIN_MOVE_S) -> dict[str, str]:
        """Start the move of each session whose daemon said it drains (all at once)
        and take the answers of those on their way (``poll`` and the others call
        it); session -> where it went, of those that landed now. Never waits,
        never re-entered: the moves advance as their answers arrive."""
        if self._moving:
            return {}
        self._moving = True
        try:
            return advance_drained(
                self._core, self.transport, self._drained, self.stranded, timeout, 1.0
            )
        finally:
            self._moving = False

    def _follow_drain(self, timeout: float) -> float:
        """A poll's moves: take their answers as they come, until a chunk is here
        or none is on its way; the poll's time left."""
        timeout = arguments.timeout(timeout)
        deadline = time.monotonic() + timeout
        self.move_drained()
        while self._drained and not self._core.has_chunks():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._pump(min(left, self._drained.wait_s() or left))
            self.move_drained()
        return max(0.0, deadline - time.monotonic())
