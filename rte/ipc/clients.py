"""The daemon's client table: who is connected, and whose sessions may step.

A client claims a slot in the claims segment itself
(:class:`rte.protocol.claims.ClaimTable`); the table here is the daemon's side:

- **adopt** ACTIVE claims of slots its roster has free, serving them through
  that slot's mailbox (:mod:`rte.protocol.mailbox`: its rings and credit block,
  opened once at start), and record the client in the roster;
- find **dead** clients (pid + start time since boot) and **leaving** ones (their
  mailbox says so) so the core can detach their sessions, then **remove**
  them: their slab slots reclaimed, their mailbox emptied, their slot FREE for
  the next client. A slot the daemon holds is judged by its own record and
  that client's mailbox alone, never by the claims, which every client can
  write: a scribbled claim disturbs no client being served;
- free a CLAIMED slot whose claimer died before finishing the claim (after a
  grace period);
- pick the **due** sessions fairly: a session steps only while it has credit
  (fewer of its chunks emitted and not released than its credits: run-ahead
  is explicit) and its owner has slab quota left (a client that holds all its
  slots stalls only its own sessions); a client with more sessions than room
  rotates which go first. Each session has a small **handle** in its client's
  credit block, where the client counts what it consumed;
- spot clients that stopped consuming (the **idle** limit), and clients that
  flood requests without reading the answers (**overflowing**).

Answers to a client go out on its outbox ring; when the ring is full they wait
in a backlog bounded in bytes, never growing without limit. Past the bound an
answer is dropped and counted: the client is told how many once it reads
again, and a client that keeps its backlog overflowing is disconnected
(**revoke**: its slot turns REVOKED in the roster, which it sees at its next
call; the slot is free again once its mailbox says it left, or it died). A
ring whose header the client garbled is treated as a full one.
"""

from __future__ import annotations

import array
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rte.ipc import figures
from rte.ipc.figures import SessionFigures
from rte.protocol.claims import ClientEntry, ClientState
from rte.protocol.control import Control
from rte.protocol.mailbox import ClientBlock, Mailbox
from rte.protocol.steps import IN_PLACE
from shm import Doorbell, Ring, RingCorrupt, RingFull, Segment, Slab, is_alive
from shm.counting import CreditJudge
from shm.fifo import FifoBell
from shm.segment import HEADER_SIZE

log = logging.getLogger("rte.daemon")
CLAIM_GRACE_S = 5.0


FEW_SESSIONS = 4  # with_credit checks this many sessions one by one, more in NumPy


@dataclass(eq=False)
class Connection:
    """The daemon's view of one connected client."""

    index: int
    pid: int
    start: float
    inbox: Ring
    outbox: Ring
    backlog_limit: int
    block: ClientBlock
    mailbox: Mailbox
    generation: int = 0  # of the claim it was adopted for
    sessions: list[str] = field(default_factory=list)
    handles: dict[str, int] = field(default_factory=dict)  # session -> handle
    backlog: collections.deque[bytes | bytearray] = field(default_factory=collections.deque)
    backlog_bytes: int = 0
    dropped: int = 0  # answers dropped since the client was last told
    overflowing_since: float | None = None
    stalled_since: float | None = None
    turn: int = 0
    names: list[str | None] = field(default_factory=list)  # handle -> session
    emitted: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(0, np.int64))
    credits: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(0, np.int64))
    next_handle: int = 0
    # the handles of the last list of sessions sent a STEP record (see Outbound)
    handle_cache: tuple[list[str], array.array[int], np.ndarray[Any, Any]] | None = None
    figures: SessionFigures | None = None  # its sessions' real-time figures, by handle

    def __post_init__(self) -> None:
        n = len(self.block.consumed)
        self.names = [None] * n
        self.emitted = np.zeros(n, np.int64)
        self.credits = np.zeros(n, np.int64)  # 0: no session, never due
        self._bound = np.zeros(n, bool)
        self._ahead = np.zeros(n, np.int64)  # scratch of with_credit, every turn
        self._due = np.zeros(n, bool)
        # shm_with_credit over these very arrays
        self._judge = CreditJudge(
            self.emitted, self.block.consumed, self.credits, self._bound, self._due
        )

    def bind(self, session: str, credits: int) -> int:
        """Give ``session`` a handle (the least recently used free one) and its credits."""
        n = len(self.names)
        for k in range(n):
            handle = (self.next_handle + k) % n
            if self.names[handle] is None:
                break
        else:
            raise RuntimeError(f"client {self.index} has no free session handle ({n})")
        self.next_handle = handle + 1
        self.handle_cache = None
        self.names[handle] = session
        self.handles[session] = handle
        self.sessions.append(session)
        self.emitted[handle] = int(self.block.consumed[handle])  # counts from here
        self.credits[handle] = credits
        self._bound[handle] = True
        if self.figures is not None:
            self.figures.bound(handle, session, time.monotonic_ns())
        return handle

    def unbind(self, session: str) -> None:
        handle = self.handles.pop(session)
        self.handle_cache = None
        self.names[handle] = None
        self.credits[handle] = 0
        self._bound[handle] = False
        self.sessions.remove(session)
        if self.figures is not None:
            self.figures.unbound(handle)

    def with_credit(self) -> list[str]:
        """The sessions that may step: fewer chunks out than their credits, judged
        in one C call (``shm_with_credit``, 0.4 us at 64 sessions where the NumPy
        reference, :meth:`with_credit_numpy`, took 3; ``RTE_PURE_PYTHON=1``: that)."""
        if not IN_PLACE:
            return self.with_credit_numpy()
        due = self._judge()
        if due == len(self.sessions):  # the usual case: all of them
            return list(self.sessions)
        if not due:
            return []
        names = self.names
        return [names[h] for h in np.flatnonzero(self._due).tolist()]  # type: ignore[misc]

    def with_credit_numpy(self) -> list[str]:
        """The reference of :meth:`with_credit`, in Python and NumPy."""
        # the client writes ``consumed`` (a stale or hostile count is only ever its own
        # sessions' problem: the slab quota still bounds it); unbound handles have 0 credits
        if len(self.sessions) <= FEW_SESSIONS:  # one by one: 1 us, where NumPy's is 2.5
            emitted, credits, handles = self.emitted, self.credits, self.handles
            consumed = self.block.consumed.view(np.int64)
            return [s for s in self.sessions if emitted[h := handles[s]] - consumed[h] < credits[h]]
        ahead = np.subtract(self.emitted, self.block.consumed.view(np.int64), out=self._ahead)
        due = np.less(ahead, self.credits, out=self._due)
        due &= self._bound
        if np.count_nonzero(due) == len(self.sessions):  # the usual case: all of them
            return list(self.sessions)
        names = self.names
        return [names[h] for h in np.flatnonzero(due).tolist()]  # type: ignore[misc]

    def send(self, record: bytes | bytearray) -> bool:
        """Push now, or queue behind earlier records; False (nothing queued,
        the drop counted) when the backlog holds its limit in bytes already."""
        if not self.backlog:
            try:
                self.outbox.push_nowait(record)
                return True
            except (RingFull, RingCorrupt):  # (corrupt: the client garbled its own ring)
                pass
        if self.backlog_bytes + len(record) > self.backlog_limit:
            self.dropped += 1
            self.overflowing_since = self.overflowing_since or time.monotonic()
            return False
        self.backlog.append(record)
        self.backlog_bytes += len(record)
        return True

    def flush(self) -> None:
        """Move what the backlog holds into the ring, as far as it has room."""
        while self.backlog:
            try:
                self.outbox.push_nowait(self.backlog[0])
            except (RingFull, RingCorrupt):
                return
            self.backlog_bytes -= len(self.backlog.popleft())
        self.overflowing_since = None  # all out: it reads again


class ClientTable:
    """The connections of one daemon, over its control segment and slab."""

    def __init__(
        self,
        control: Control,
        segment: Segment,
        slab: Slab,
        bell: Doorbell,
        client_bells: list[Doorbell],
        client_wakes: list[FifoBell],
        figures: Segment | None = None,
        period_ns: int = 0,
    ) -> None:
        """``figures``: the segment of every client's session figures (``period_ns``:
        the pace they are counted at; 0 unpaced)."""
        self.control = control
        self.segment = segment
        self.slab = slab
        self.bell = bell
        self.client_bells = client_bells
        self.client_wakes = client_wakes
        self.connections: dict[int, Connection] = {}
        self.revoked: dict[int, Connection] = {}  # until the client leaves or dies
        self.backlog_limit = 2 * control.layout.ring_capacity
        self.figures = figures
        self.period_ns = period_ns

    def scan(self) -> list[Connection]:
        """Adopt new clients, free abandoned claims and revoked slots whose client
        left; returns the dead or leaving connections (still in the table: detach
        their sessions, then :meth:`remove` them)."""
        dead = []
        claims = self.control.claim_table
        for index in range(claims.max_clients):
            known = self.connections.get(index)
            if known is not None:  # ours: its mailbox and the process table decide
                if known.mailbox.leaving:  # it left without a BYE
                    dead.append(known)
                elif not is_alive(known.pid, known.start):
                    log.warning("client %d (pid %d) died; reclaiming", known.index, known.pid)
                    dead.append(known)
                continue
            revoked = self.revoked.get(index)
            if revoked is not None:
                if revoked.mailbox.leaving or not is_alive(revoked.pid, revoked.start):
                    del self.revoked[index]
                    self._free(revoked)
                continue
            claim = claims.entry(index)
            if claim.state is ClientState.ACTIVE:
                self._adopt(claim)
            elif claim.state is ClientState.CLAIMED:
                age = (time.monotonic_ns() - claim.since_ns) / 1e9
                if not 0 <= age <= CLAIM_GRACE_S:  # its claimer died before finishing it
                    claims.abandon(index, claim.generation)
            elif claims.garbled(index):  # written over while free: free again
                claims.free(index, claim.generation)
        return dead

    def _adopt(self, claim: ClientEntry) -> None:
        index = claim.index
        if not is_alive(claim.pid, claim.start):  # gone already, or a claim written over
            self.control.claim_table.free(index, claim.generation)
            return
        layout = self.control.layout
        mailbox = self.control.mailboxes[index]
        mailbox.inbox.doorbell = self.bell
        mailbox.outbox.doorbell = (self.client_wakes if claim.wakes_by_fd else self.client_bells)[
            index
        ]
        mailbox.block.reset()
        connection = Connection(
            index,
            claim.pid,
            claim.start,
            mailbox.inbox,
            mailbox.outbox,
            self.backlog_limit,
            mailbox.block,
            mailbox,
            claim.generation,
        )
        if self.figures is not None:  # a new client's figures start empty
            handles = layout.handles
            each = figures.size(handles)
            mine = self.figures.bytes_at(HEADER_SIZE + index * each, each)
            connection.figures = SessionFigures(mine, handles, self.period_ns)
            connection.figures.clear()
        self.connections[index] = connection
        self.control.table.adopt(claim)
        log.info(
            "client %d (pid %d) connected; %d clients", index, claim.pid, len(self.connections)
        )

    def remove(self, connection: Connection, *, revoked: bool = False) -> None:
        """Give back everything a client held (its sessions are detached already).

        Its slot becomes FREE for the next client, or, when the client is
        alive and ``revoked``, REVOKED until it leaves or dies: its rings are
        no longer read either way.
        """
        index, roster = connection.index, self.control.table
        roster.set_state(index, ClientState.CLOSING)
        del self.connections[index]
        self.slab.reclaim(index)
        connection.inbox.reset()
        connection.outbox.reset()
        roster.set_sessions(index, 0)
        if revoked and not connection.mailbox.leaving:
            self.revoked[index] = connection
            roster.set_state(index, ClientState.REVOKED)
        else:
            self._free(connection)

    def _free(self, connection: Connection) -> None:
        """The slot is free: its mailbox emptied, then the roster, then the claim
        (last: a claimer that sees the claim free finds the roster free too)."""
        index = connection.index
        connection.mailbox.clear(time.monotonic_ns())
        self.control.table.set_sessions(index, 0)
        self.control.table.set_state(index, ClientState.FREE)
        self.control.claim_table.free(index, connection.generation)

    def overflowing(self, now: float, limit: float) -> list[Connection]:
        """Connections that have dropped answers for more than ``limit`` seconds
        on end: they send requests and do not read what comes back."""
        return [
            c
            for c in self.connections.values()
            if c.overflowing_since is not None and now - c.overflowing_since > limit
        ]

    def publish_sessions(self, connection: Connection) -> None:
        """Show the connection's session count in the table (for inspectors)."""
        self.control.table.set_sessions(connection.index, len(connection.sessions))

    def room(self, connection: Connection) -> int:
        """Slab slots the connection may still take."""
        return self.slab.quota - self.slab.held(connection.index)

    def due(self) -> list[str]:
        """Sessions with credit whose owner has a free slot for them, fairly rotated."""
        due: list[str] = []
        for connection in self.connections.values():
            if not connection.sessions:
                continue
            room = self.room(connection)
            if room <= 0:
                continue
            ready = connection.with_credit()
            if room >= len(ready):
                due += ready
                continue
            start = connection.turn % len(ready)
            connection.turn += 1
            due += (ready[start:] + ready[:start])[:room]
        return due

    def can_step(self) -> bool:
        """Whether some session could step now (its owner released a slot and credit)."""
        return any(
            c.sessions and self.room(c) > 0 and c.with_credit() for c in self.connections.values()
        )

    def starve(self) -> None:
        """Before the daemon sleeps: mark each client whose sessions wait for it, so
        that its next release rings the doorbell (then :meth:`can_step` is re-checked)."""
        for c in self.connections.values():
            if c.sessions:
                c.block.starve()

    def idle(self, now: float, limit: float) -> list[Connection]:
        """Connections whose sessions have waited on them for more than ``limit``
        seconds: they consumed nothing while chunks or answers were ready."""
        idle = []
        for c in self.connections.values():
            stalled = c.sessions and (
                c.backlog or self.room(c) <= 0 or c.outbox.used() > 0 or not c.with_credit()
            )
            if not stalled:
                c.stalled_since = None
                continue
            c.stalled_since = c.stalled_since or now
            last_pop = c.mailbox.last_pop_ns / 1e9
            if now - max(c.stalled_since, last_pop) > limit:
                c.stalled_since = None
                idle.append(c)
        return idle
