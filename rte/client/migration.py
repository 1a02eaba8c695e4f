"""Moving a pool's sessions between its daemons: migrate one, drain a daemon.

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

A drain moves only this client's sessions; a daemon-wide ``rte drain`` would
need the daemon to hand each client a "move" notice (not built).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rte.client.base import EngineClient
from rte.errors import AdmissionError, EngineGone, RequestError, RteError, UnknownSessionError
from rte.state import SessionState

if TYPE_CHECKING:
    from rte.client.pool import PoolTransport


class MigrationError(AdmissionError):
    """A move was refused by every target and by the daemon it came from: the
    session is attached nowhere, and its exported state is :attr:`state` (attach
    it with ``attach(session, state=error.state)`` once there is room)."""

    def __init__(self, message: str, state: SessionState) -> None:
        super().__init__(message)
        self.state = state


class Migrating(EngineClient):
    """:meth:`migrate` and :meth:`drain` for a client over a :class:`PoolTransport`."""

    transport: PoolTransport

    def migrate(self, session: str, to: str | Sequence[str], *, timeout: float = 5.0) -> str:
        """Move ``session`` to daemon ``to`` (or the first of several that takes it);
        the daemon it went to. AdmissionError when every target refuses it (it is
        attached back where it was, going on; :class:`MigrationError` if even that
        failed), RequestError for a target not of this pool or its own daemon,
        UnknownSessionError for a session not attached."""
        pool = self.transport
        old = pool.home.get(session)
        if old is None or session not in self.sessions:
            raise UnknownSessionError(f"session {session!r} is not attached to pool {pool.name!r}")
        targets = [to] if isinstance(to, str) else list(to)
        for name in targets:
            if name not in pool.members:
                raise RequestError(f"{name!r} is not a daemon of pool {pool.name!r}")
            if name == old:
                raise RequestError(f"session {session!r} lives on {name!r} already")
        if not any(name in pool.live() for name in targets):
            raise EngineGone(f"no daemon of {targets} is live: {session!r} stays on {old!r}")
        state = self.export(session, timeout=timeout)
        try:
            return self._attach_on(session, state, targets, timeout)
        except RteError as refused:
            try:
                self._attach_on(session, state, [old], timeout)
            except RteError as also:
                raise MigrationError(
                    f"moving {session!r}: refused by {targets} ({refused}) and by "
                    f"{old!r} it came from ({also}); attach it with state=error.state",
                    state,
                ) from refused
            raise AdmissionError(
                f"moving {session!r} to {targets}: {refused}; it is back on {old!r}, going on"
            ) from refused

    def drain(self, name: str, *, timeout: float = 5.0) -> dict[str, str]:
        """Move every session of this client on daemon ``name`` to the pool's other
        live daemons (most free rows first); session -> where it went. The first
        one that cannot move raises as :meth:`migrate` does (those before it moved)."""
        pool = self.transport
        if name not in pool.members:
            raise RequestError(f"{name!r} is not a daemon of pool {pool.name!r}")
        moved: dict[str, str] = {}
        for session in sorted(s for s in self.sessions if pool.home.get(s) == name):
            others = [n for n in pool.live() if n != name]
            others.sort(key=pool.free_rows, reverse=True)
            if not others:
                raise EngineGone(f"draining {name!r}: no other daemon of the pool is live")
            moved[session] = self.migrate(session, others, timeout=timeout)
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
