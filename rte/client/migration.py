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
of the pace's periods (``tests/test_migrate.py`` prints it).

**A daemon-wide drain** (``rte drain NAME``, :mod:`rte.ipc.draining`) tells
each client, with a DRAINING notice per session, that its session is to move.
A pool never moves it from inside a receive: the pool holds the notice back
(:class:`DrainMoves`) and the client moves the session at its next safe point,
the entry of ``poll``, ``poll_batch``, ``results`` or ``notices`` (the asyncio
client's ``poll``, ``poll_batch`` and ``results``), as :meth:`Migrating.drain`
would: to the pool's other live daemons, most free rows first. The DRAINING
notice then surfaces among :meth:`notices`, its message saying where the
session went (``... moved to 'gpu-1'``), or why it could not move: it stays
where it is and the move is tried again every :data:`MOVE_RETRY_S` while its
daemon still holds it. A session whose state every daemon refused is attached
nowhere; its state is kept in :attr:`Migrating.stranded` and an ERROR notice
says so. A plain (single daemon) client cannot move: it only sees the notice.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rte.client.base import EngineClient
from rte.client.batch import ChunkBatch
from rte.client.core import Chunk
from rte.contract import Notice, NoticeKind
from rte.errors import AdmissionError, EngineGone, RequestError, RteError, UnknownSessionError
from rte.state import SessionState

if TYPE_CHECKING:
    from rte.client.pool import PoolTransport

MOVE_RETRY_S = 1.0  # a drained session that could not move is tried again this often


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
    if name not in pool.members:
        raise RequestError(f"{name!r} is not a daemon of pool {pool.name!r}")
    others = sorted((n for n in pool.live() if n != name), key=pool.free_rows, reverse=True)
    if not others:
        raise EngineGone(f"draining {name!r}: no other daemon of the pool is live")
    return sorted(others, key=pool.placer.draining)  # (stable: the free rows' order kept)


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


class Migrating(EngineClient):
    """:meth:`migrate` and :meth:`drain` for a client over a :class:`PoolTransport`,
    and its moves when a daemon drains (see the module).

    Attributes:
        stranded: session -> its state, for a drained session every daemon refused
            (attached nowhere: ``attach(s, state=client.stranded.pop(s))``).
    """

    transport: PoolTransport
    stranded: dict[str, SessionState]
    _moving: bool

    def migrate(self, session: str, to: str | Sequence[str], *, timeout: float = 5.0) -> str:
        """Move ``session`` to daemon ``to`` (or the first of several that takes it);
        the daemon it went to. AdmissionError when every target refuses it (it is
        attached back where it was, going on; :class:`MigrationError` if even that
        failed), RequestError for a target not of this pool or its own daemon,
        UnknownSessionError for a session not attached."""
        move = Move.of(self.transport, self.sessions, session, to)
        state = self.export(session, timeout=timeout)
        try:
            return self._attach_on(session, state, move.targets, timeout)
        except RteError as refused:
            try:
                self._attach_on(session, state, [move.old], timeout)
            except RteError as also:
                raise move.stranded(state, refused, also) from refused
            raise move.back(refused) from refused

    def drain(self, name: str, *, timeout: float = 5.0) -> dict[str, str]:
        """Move every session of this client on daemon ``name`` to the pool's other
        live daemons (most free rows first); session -> where it went. The first
        one that cannot move raises as :meth:`migrate` does (those before it moved)."""
        pool = self.transport
        drain_targets(pool, name)  # (checked before any move)
        moved: dict[str, str] = {}
        for session in sorted(s for s in self.sessions if pool.home.get(s) == name):
            moved[session] = self.migrate(session, drain_targets(pool, name), timeout=timeout)
        return moved

    # -- a daemon drains: the moves, at the safe points -------------------------

    def poll(self, timeout: float = 1.0) -> Chunk | None:
        if self.transport.moves:
            self.move_drained()
        return super().poll(timeout)

    def poll_batch(self, timeout: float = 1.0) -> ChunkBatch | None:
        if self.transport.moves:
            self.move_drained()
        return super().poll_batch(timeout)

    def notices(self) -> list[Notice]:
        news = super().notices()  # (what came, a DRAINING among it, is held by the pool)
        if self.transport.moves:
            self.move_drained()
            news += self._core.drain_notices()
        return news

    def move_drained(self, *, timeout: float = 5.0) -> dict[str, str]:
        """Move each session whose daemon said it drains, now (``poll`` and the
        others call it); session -> where it went. Never re-entered: a move's own
        waits only receive, and what they receive waits for the next call."""
        if self._moving:
            return {}
        self._moving = True
        pool, moved, moves = self.transport, {}, self.transport.moves
        try:
            for told in moves.due():
                session = told.notice.session
                if moves.stale(told, pool, self.sessions):  # (told already: not again)
                    self._core.sort([] if told.tries else [told.notice])
                    continue
                try:
                    to = self.migrate(session, drain_targets(pool, told.name), timeout=timeout)
                    news = moves.after(told, to)
                    moved[session] = to
                except RteError as why:
                    if isinstance(why, MigrationError):
                        self.stranded[session] = why.state
                    news = moves.after(told, error=why)
                self._core.sort([] if news is None else [news])
        finally:
            self._moving = False
        return moved

    def _attach_on(
        self, session: str, state: SessionState, names: list[str], timeout: float
    ) -> str:
        """Attach ``session`` with ``state`` on the first of ``names`` that takes it."""
        pool = self.transport
        pool.pinned[session] = names
        try:
            self.attach(session, state=state, timeout=timeout)
        finally:
            del pool.pinned[session]
        return pool.home.get(session, "")
