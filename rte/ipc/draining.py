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
   A session it told to move that its client exported counts as held for
   :data:`AWAY_GRACE_S` more while that client is connected: the move may yet
   be refused everywhere and the session come back here (step 3), and a count
   that read 0 in between would let ``rte drain --stop`` stop the daemon
   under it. A drain therefore ends at most that much after its last move.

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
AWAY_GRACE_S = 1.0  # a told session exported by its client may come back this long after


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
        self._away: dict[str, float] = {}  # told, not here now: since (monotonic)
        self._landed: set[str] = set()  # told, away past the grace: not held

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
        """Sessions this daemon holds: attached (parked ones too), being detached,
        or told to move and out on their move (they may come back: see the module)."""
        return len(self.router.owners) + len(self.departures.orphans) + len(self._away)

    def publish(self) -> None:
        """The sessions held, into the control block (for ``rte drain`` and inspect)."""
        self._moving_out(time.monotonic())
        self.control.set_held(self.held())

    def _moving_out(self, now: float) -> None:
        """Which told sessions are out on a move that may still bring them back: not
        here now, their client connected, gone for under :data:`AWAY_GRACE_S`."""
        connected = self.departures.table.connections
        for session, client in list(self._told.items()):
            if self.router.owners.get(session) is client:
                self._away.pop(session, None)  # here (again)
                self._landed.discard(session)
            elif session in self._landed:
                continue
            elif connected.get(client.index) is not client:
                self._away.pop(session, None)  # its client left: it cannot come back
                self._landed.add(session)
            elif now - self._away.setdefault(session, now) >= AWAY_GRACE_S:
                del self._away[session]  # it stayed away: it landed elsewhere
                self._landed.add(session)

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
        """The sessions held, each with its client (orphans: none; out on a move:
        the client moving it)."""
        owned = [Held(s, c.index, c.pid) for s, c in sorted(self.router.owners.items())]
        away = [Held(s, self._told[s].index, self._told[s].pid, True) for s in sorted(self._away)]
        orphans = [Held(s, -1, 0) for s in sorted(self.departures.orphans)]
        return tuple(owned + away + orphans)
