"""Draining: a daemon that lets its sessions go to the pool's others, then can stop.

``rte drain NAME`` (:mod:`rte.cli.drain`) sends DRAIN (:mod:`rte.protocol.drain`);
:class:`~rte.ipc.intake.Intake` hands it here. From the first one on, the
daemon is draining, for the rest of its life:

1. its control block says since when (``rte inspect`` shows it; a pool's
   placer tries a draining member last);
2. every session it holds is told once, a DRAINING notice to its client: a
   :class:`~rte.client.PoolClient` moves it to another member at its next
   safe point (export here, attach there: no gap, no repeat), a plain client
   only sees the notice;
3. every new attach is REJECTED, saying the daemon is draining (a pool's
   placer takes that as any refusal and tries the next member); a session it
   holds already may still reset, suspend, resume and export (how it leaves),
   and one it told to move comes back with its state when every other daemon
   refused it (its client's move puts it back where it was: never lost);
4. how many sessions it still holds is published at once and at every scan
   (:meth:`publish`), so the command waits for 0 reading shared memory alone.

Each DRAIN is answered with a :class:`~rte.protocol.drain.DrainReport` naming the
sessions still there and their clients (what the command prints on a timeout).
"""

from __future__ import annotations

import logging
import time

from rte.contract import Notice, NoticeKind
from rte.ipc.clients import Connection
from rte.ipc.departures import Departures
from rte.ipc.outbound import Outbound
from rte.ipc.router import Router
from rte.protocol.control import Control, Counter
from rte.protocol.drain import Drain, DrainReport, Held

log = logging.getLogger("rte.daemon")


class Draining:
    """Daemon ``name``'s drain (not begun until the first DRAIN); see the module."""

    def __init__(
        self, name: str, control: Control, router: Router, departures: Departures, out: Outbound
    ) -> None:
        self.name = name
        self.control = control
        self.router = router
        self.departures = departures
        self.out = out
        self.since_ns = 0  # time.time_ns() when it began; 0: not draining
        self._told: dict[str, Connection] = {}  # session -> the client told (once each)

    @property
    def draining(self) -> bool:
        return self.since_ns != 0

    def begin(self, connection: Connection, request: Drain) -> None:
        """A DRAIN from ``connection``: drain (once), then answer with the report."""
        already = self.draining
        if not already:
            self.since_ns = time.time_ns()
            self.control.set_draining(self.since_ns)
            log.info(
                "client %d (pid %d) drains this daemon: %d sessions to move, no new attach",
                connection.index,
                connection.pid,
                self.held(),
            )
            self._tell()
        self.publish()
        since_s = (time.time_ns() - self.since_ns) / 1e9
        report = DrainReport(already, since_s, self.held(), self._listed())
        self.out.send(connection, Notice("", NoticeKind.DRAINING, report.to_message(), request.seq))

    def refusal(self, requester: Connection, session: str, moved_in: bool) -> str | None:
        """Why an attach of ``session`` by ``requester`` is REJECTED (None: not
        draining; the session is ``requester``'s already, the engine keeps it; or
        ``moved_in``, with its state, it is one of ``requester``'s told to move,
        coming back: every daemon it was sent to refused it, and its state must
        not be lost)."""
        if not self.draining or self.router.owner(session) is requester:
            return None
        if moved_in and self._told.get(session) is requester:
            return None
        self.control.count(Counter.ADMISSION_REJECTIONS)
        return (
            f"daemon {self.name!r} is draining: it takes no new session ({session!r}); "
            "attach it to another daemon (a pool places it on another member)"
        )

    def held(self) -> int:
        """Sessions this daemon holds: attached (parked ones too) or being detached."""
        return len(self.router.owners) + len(self.departures.orphans)

    def publish(self) -> None:
        """The sessions held, into the control block (for ``rte drain`` and inspect)."""
        self.control.set_held(self.held())

    def _tell(self) -> None:
        """Each session's client, once: its session is to move."""
        for session, owner in list(self.router.owners.items()):
            if session in self._told:
                continue
            self._told[session] = owner
            text = (
                f"daemon {self.name!r} is draining: move session {session!r} to another "
                "daemon (export it, attach it there with its state; a pool does so itself)"
            )
            self.out.send(owner, Notice(session, NoticeKind.DRAINING, text))

    def _listed(self) -> tuple[Held, ...]:
        """The sessions held, each with its client (orphans: none)."""
        owned = [Held(s, c.index, c.pid) for s, c in sorted(self.router.owners.items())]
        return tuple(owned) + tuple(Held(s, -1, 0) for s in sorted(self.departures.orphans))
