"""Departures: how sessions and clients leave a daemon, whatever made them go.

A session leaves because its client asked (a DETACH or RESET, through
:mod:`rte.ipc.intake`), because its own seed or encode failed in a step (the
serve loop detaches it), because its client consumed nothing for the idle
limit, or because its client left, died or was disconnected for flooding
requests. Every way goes through :meth:`Departures.detach`, which asks the
serve loop and delivers what came of it:

- a detaching session's in-flight chunk is finalized only when its owner has
  a slab slot for it; otherwise the owner is told the chunk is dropped (a
  slot shortage never fails a step for everyone);
- a session the engine would not detach (its detach raised) is an
  **orphan** when its client is gone: owned by nobody, never bound to a slot
  a new client takes, and its detach is retried every ``ORPHAN_RETRY_S``;
- a client that goes has its sessions detached without finalizing (nobody is
  left to read the last chunk), its input segment reset, then its slot given
  back (:meth:`rte.ipc.clients.ClientTable.remove`).
"""

from __future__ import annotations

import logging

from rte.contract import Notice, NoticeKind
from rte.errors import EngineFault
from rte.ipc.clients import ClientTable, Connection
from rte.ipc.inputs import Inputs
from rte.ipc.outbound import Outbound
from rte.ipc.router import Router
from rte.protocol.control import Control, Counter
from rte.serve import OutboxItem, ServeLoop

log = logging.getLogger("rte.daemon")
ORPHAN_RETRY_S = 1.0  # how often the detach of a session the engine kept is retried


class Departures:
    """Detaches sessions and removes clients, for every reason they go."""

    def __init__(
        self,
        control: Control,
        loop: ServeLoop,
        table: ClientTable,
        router: Router,
        inputs: Inputs,
        out: Outbound,
    ) -> None:
        self.control = control
        self.loop = loop
        self.table = table
        self.router = router
        self.inputs = inputs
        self.out = out
        self.orphans: set[str] = set()  # detached from their client, not from the engine
        self._next_orphan_retry = 0.0

    def room_to_finalize(self, session: str) -> bool:
        """Whether a detaching session's in-flight chunk has a slot to go to. If
        not, its owner is told the chunk is dropped."""
        owner = self.router.owner(session)
        if owner is None or self.table.room(owner) > 0:
            return True
        dropped = Notice(
            session, NoticeKind.DROPPED, "in-flight chunk dropped at detach: no free slot"
        )
        self.out.deliver([dropped], None)
        return False

    def detach(self, session: str, *, reason: str = "", finalize: bool = True) -> bool:
        """Detach through the loop; True when the session is gone. Chunks finalized
        before a failure still go out; the engine keeps a session whose detach failed."""
        finalize = finalize and self.room_to_finalize(session)
        out: list[OutboxItem] = []
        try:
            self.loop.detach(session, finalize=finalize, reason=reason, out=out)
            self.inputs.drop(session)
            gone = True
        except EngineFault:
            raise
        except Exception as exc:
            text = f"detach failed: {type(exc).__name__}: {exc}"
            out.append(Notice(session, NoticeKind.ERROR, text))
            gone = False
        self.out.deliver(out, None)
        return gone

    def reap(self, connection: Connection, *, reason: str = "", revoked: bool = False) -> None:
        """Detach a gone (or leaving, or revoked) client's sessions, give back all it
        held. A session the engine would not detach is kept as an orphan."""
        for session in list(connection.sessions):
            # nobody is left to read its last chunk
            if not self.detach(session, reason=reason, finalize=False):
                self.router.release(session)
                self.orphans.add(session)
        self.inputs.reset(connection.index)  # its input segment, before its slot is free
        self.table.remove(connection, revoked=revoked)

    def retry_orphans(self, now: float) -> None:
        """Try again to detach the sessions the engine kept, once a second."""
        if self.orphans and now >= self._next_orphan_retry:
            self._next_orphan_retry = now + ORPHAN_RETRY_S
            self.orphans = {s for s in self.orphans if not self.detach(s, finalize=False)}

    def detached_by(self, outcome: list[OutboxItem]) -> list[tuple[str, Connection]]:
        """The sessions a step's ``outcome`` detaches (their own failure), with their
        owners: read before the outcome is delivered, which unbinds them."""
        if not outcome or type(outcome[-1]) is not Notice:
            return []
        detached = NoticeKind.DETACHED
        return [
            (item.session, owner)
            for item in outcome
            if type(item) is Notice
            and item.kind is detached
            and (owner := self.router.owner(item.session)) is not None
        ]

    def detached(self, left: list[tuple[str, Connection]]) -> None:
        """The sessions :meth:`detached_by` named are gone: their inputs go back."""
        for session, owner in left:
            self.inputs.drop(session)
            self.table.publish_sessions(owner)

    def idle_and_flooding(self, now: float, limit: float) -> None:
        """Detach the sessions of clients that consumed nothing for ``limit`` seconds
        (and tell them why); disconnect clients that flood requests without reading."""
        for idle in self.table.idle(now, limit):
            reason = f"idle: nothing consumed for {limit:g}s (the idle limit)"
            for session in list(idle.sessions):
                self.detach(session, reason=reason, finalize=False)
                self.control.count(Counter.IDLE_DETACHES)
            self.table.publish_sessions(idle)
        for flooder in self.table.overflowing(now, limit):
            log.warning(
                "client %d (pid %d) reads no answers: disconnected", flooder.index, flooder.pid
            )
            reason = "disconnected: its client sent requests without reading the answers"
            self.reap(flooder, reason=reason, revoked=True)
            self.control.count(Counter.CLIENTS_DISCONNECTED)

    def everyone(self) -> None:
        """The daemon stops: detach every session, owned or orphan, finalizing."""
        for session in [*self.router.owners, *self.orphans]:
            self.detach(session)
