"""PoolClient: one client interface over several daemons (one per GPU, say).

    from rte.client import connect_pool

    with connect_pool(["gpu-0", "gpu-1"]) as client:   # or connect("gpu"): finds gpu-*
        client.attach("alice", {"prompt": "a forest"})  # to the daemon with most room
        for chunk in client.results(timeout=1.0): ...

:class:`PoolTransport` is a transport over the pool's daemons
(:class:`~rte.client.members.Members`: one
:class:`~rte.client.shm.ShmTransport` per daemon, woken through its FIFO), so
one wait covers every daemon: a sync client polls all their descriptors at
once, an asyncio one (``connect_async("gpu")``) watches them all with
``add_reader``.

Sessions are sticky: a session lives on the daemon it was admitted to, and
every request about it goes there (:class:`rte.placement.Placement`, the one
policy the Ray router and ReplicaEngine use too). An attach is placed by
:class:`~rte.client.placing.Placer`: the daemons in order of most free rows,
each refusal passing it to the next, so the caller sees one answer: the first
daemon's ATTACHED, or one REJECTED that names every daemon's refusal.

A daemon that drains (``rte drain``) refuses every new session (the placer
tries it last) and sends a DRAINING notice for each of its sessions: the pool
holds it back until its client moved the session elsewhere, at its next safe
point (:mod:`rte.client.migration`).

When a daemon dies, only its sessions are lost: each gets an ERROR notice that
says ``EngineGone`` and which daemon, calls naming them raise
:class:`~rte.errors.EngineGone`, and the other daemons' sessions go on without
a gap. With ``reattach=True`` the pool attaches them again elsewhere with
their last conditioning (their stream restarts at chunk 0; an ATTACHED notice
says where), as far as there is room. Given ``recover`` too (a dead daemon's
name -> its sessions' states: :func:`rte.ipc.checkpoints.read_checkpoint` of a
daemon run with ``--checkpoint-every K``), each session that has a checkpoint
moves in elsewhere with that state instead: it goes on from the checkpoint's
chunk (at most K chunks, plus those in flight, are made again, frame for frame
those it made before), and its ATTACHED notice says from which chunk.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rte.client.batch import ChunkBatch, Release
from rte.client.in_flight import MovesInFlight
from rte.client.inputs import InputLoan, loan_layout
from rte.client.late_attaches import LateAttaches
from rte.client.members import Members
from rte.client.migration import DrainMoves, Migrating
from rte.client.placing import Placer
from rte.client.shm import ShmTransport, SlotLease
from rte.client.transport import Arrival, Gone, Numbering, Transport
from rte.contract import Notice, NoticeKind
from rte.errors import EngineGone, RteError, UnknownSessionError
from rte.placement import Placement
from rte.protocol.inputs import conditioning_of
from rte.protocol.requests import Act, Attach, Detach, Export, Request, Reset, with_state
from rte.protocol.values import InputRef
from rte.state import SessionState

CHECK_EVERY_S = 0.1  # a sleeping pool checks its daemons' liveness this often
DRAIN_ROOM_S = 0.5  # how long a poll's drain move waits for room in a ring or an input slot
Recover = Callable[[str], Mapping[str, SessionState]]  # a dead daemon -> its sessions' states
log = logging.getLogger(__name__)


class PoolTransport(Transport):
    """The daemons ``names`` as one transport; see the module."""

    def __init__(
        self,
        names: list[str],
        *,
        timeout: float | None = None,
        reattach: bool = False,
        recover: Recover | None = None,
    ) -> None:
        self.daemons = Members(names, timeout)
        self.recover = recover
        self.members = self.daemons.by_name  # name -> that daemon's transport
        self.missing = self.daemons.missing  # down when tried: tried again at each attach
        self.name, self.manifest = "+".join(names), self.daemons.manifest
        self.reattach = reattach
        self.home: Placement[str] = Placement()  # session -> the daemon it lives on (sticky)
        self._lost: dict[str, str] = {}  # session -> why (its daemon died)
        self._last: dict[str, dict[str, Any]] = {}  # session -> its conditioning, merged
        self._reattaching: dict[int, str] = {}  # seq of a reattach -> its session
        self._from_chunk: dict[int, int] = {}  # seq of a reattach from a checkpoint -> its chunk
        self._pending: list[Arrival] = []  # what lost sessions leave, to hand out
        self._numbering: Numbering = lambda: 0
        self._exporting: dict[int, ShmTransport] = {}  # seq of an export -> its daemon
        self.pinned: dict[str, list[str]] = {}  # session -> the daemons it may go to (a move)
        self.moves = DrainMoves()  # DRAINING notices held back until the client moves them
        self.placer = Placer(self.name, self.daemons, self.home, self.pinned, self._lose)
        self.late_attaches = LateAttaches(self._given_up, self._detach_copy)  # a move's, late

    def number_with(self, numbering: Numbering) -> None:
        self._numbering = numbering

    def live(self) -> list[str]:
        return self.daemons.live()

    def free_rows(self, name: str) -> int:
        """Rows of daemon ``name`` no client's session holds (its table says)."""
        return self.daemons.free_rows(name)

    # -- requests out -----------------------------------------------------------

    def send(self, request: Request, room_s: float = 0.0) -> None:
        session = request.session
        if session in self._lost:
            raise EngineGone(self._lost[session])
        if isinstance(request, Attach):
            return self.placer.place(request, room_s)
        name = self.home.get(session) or next(iter(self.live()), "")
        if not name:  # not ours: any daemon answers that it is not attached
            raise EngineGone(f"every daemon of pool {self.name!r} is gone")
        try:
            self.members[name].send(request, room_s)
        except EngineGone:
            self._lose(name)
            raise
        # what a reattach sends again (a frame lent by slot is the daemon's: not kept)
        kept = _kept(request)
        if isinstance(request, Reset) and request.conditioning is not None:
            self._last[session] = kept  # replaced whole
        elif isinstance(request, Act) and session in self._last:
            self._last[session].update(kept)
        elif isinstance(request, Detach):
            self._last.pop(session, None)

    def loan(self, shape: tuple[int, ...], dtype: Any, timeout: float) -> InputLoan:
        shape, dtype, _ = loan_layout(shape, dtype)  # which daemon it goes to is not known
        return InputLoan(np.empty(shape, dtype), None)

    def lend(self, request: Request, timeout: float) -> Request:
        """Through its session's daemon's input slab (an attach: where it is placed)."""
        member = self._home_member(request)
        return request if member is None else member.lend(request, timeout)

    def unlend(self, request: Request) -> None:
        member = self._home_member(request)
        if member is not None:
            member.unlend(request)

    def export_into(self, request: Export, timeout: float) -> Export:
        """Into a slot of its session's daemon's input segment (see :meth:`exported`)."""
        member = self._home_member(request)
        if member is None:
            raise UnknownSessionError(f"session {request.session!r} is not attached")
        lent = member.export_into(request, timeout)
        self._exporting[lent.seq] = member
        return lent

    def exported(self, request: Export, nbytes: int) -> SessionState:
        return self._exporting[request.seq].exported(request, nbytes)

    def export_done(self, request: Export) -> None:
        member = self._exporting.pop(request.seq, None)
        if member is not None:
            member.export_done(request)

    def home_of(self, session: str) -> str:
        return self.home.get(session, "")

    def pin(self, session: str, first: str) -> None:
        """Daemon ``first`` first, then the others live (its state is never stranded
        while one takes it)."""
        if first in self.members:
            self.pinned[session] = [first, *(name for name in self.live() if name != first)]

    def unpin(self, session: str) -> None:
        self.pinned.pop(session, None)

    def _given_up(self, seq: int) -> str:
        """The attach ``seq`` in flight, given up on: no longer the placer's; its daemon."""
        placing = self.placer.take(seq)
        return "" if placing is None else placing.member

    def _detach_copy(self, name: str, session: str) -> int:
        """Send daemon ``name`` a DETACH of its late copy of ``session``; its seq (0:
        no room now, or the daemon is gone)."""
        member = self.members[name]
        request = Detach(session, seq=self._numbering())
        try:
            member.send(request, 0.0)
        except RteError:
            return 0
        return request.seq

    def _home_member(self, request: Request) -> ShmTransport | None:
        if isinstance(request, Attach):
            return None  # placed (and lent) by the placer, member by member
        member = self.members.get(self.home.get(request.session, ""))
        return None if member is None or member.closed else member

    # -- arrivals in ------------------------------------------------------------

    def receive(self, release: Release) -> list[Arrival]:
        out: list[Arrival] = []
        lates = self.late_attaches
        for name in self.live():
            try:
                items = self.members[name].receive(release)
            except EngineGone:
                self._lose(name)
                continue
            for item in items:
                if isinstance(item, Notice):
                    answer = self._sorted(name, item)
                    if answer is not None:
                        out.append(answer)
                elif isinstance(item, ChunkBatch) and lates.copies:
                    out += lates.without_copies(name, item, release, self.give_back)
                else:
                    out.append(item)
        if lates.copies:
            lates.retry()
        out += self._pending
        self._pending = []
        if not out and not self.live():  # (what was pending is handed out first)
            raise EngineGone(f"every daemon of pool {self.name!r} is gone")
        return out

    def _sorted(self, name: str, item: Notice) -> Notice | None:
        """Member ``name``'s notice, as the caller is to see it (None: not at all)."""
        if self.late_attaches:  # (a move's attach given up on, or its copy, answered)
            sorted_item = self.late_attaches.sort(name, item)
            if sorted_item is None:
                return None
            item = sorted_item
        placing = self.placer.take(item.seq)
        if placing is not None and item.kind is NoticeKind.REJECTED:
            return self.placer.rejected(name, placing, item)  # (None: the next daemon answers)
        if item.kind is NoticeKind.ATTACHED:
            self.home.settle(item.session, name)
            self._lost.pop(item.session, None)
            if self._reattaching.pop(item.seq, None) is not None and item.seq in self._from_chunk:
                chunk = self._from_chunk.pop(item.seq)
                told = f"reattached on {name!r} from its last checkpoint: on at chunk {chunk}"
                item = Notice(item.session, item.kind, told, item.seq)
            if placing is not None and item.session not in self.pinned:  # (a move keeps its own)
                self._last[item.session] = _kept(placing.request)
        elif self._reattaching.pop(item.seq, None) is not None:
            self._from_chunk.pop(item.seq, None)  # a reattach refused: the session stays lost
        elif item.kind is NoticeKind.DETACHED and self.home.get(item.session) == name:
            self.home.release(item.session)  # (a reset's ATTACHED, next, puts it back)
        elif item.kind is NoticeKind.DRAINING and self.home.get(item.session) == name:
            self.moves.add(name, item)  # moved by the client at its next safe point
            return None  # (rte.client.migration: the notice then says where it went)
        return item

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self._pending or not self.live() or self.daemons.ready():
                return True  # (none live: receive says so)
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for name in self.daemons.sleep(min(left, CHECK_EVERY_S)):
                self._lose(name)

    def give_back(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        lease: SlotLease = batch.lease
        if not lease.transport.closed:
            lease.transport.give_back(batch, rows)

    # -- waiting on an event loop -------------------------------------------

    def wake_fds(self) -> list[int]:
        return self.daemons.wake_fds()

    def arm(self) -> bool:
        return bool(self._pending) or self.daemons.arm()

    def disarm(self) -> bool:
        for name in self.daemons.disarm():
            self._lose(name)
        return True

    def check_live(self, alive: bool = True) -> None:
        if not self.live() and not self._pending:
            raise EngineGone(f"every daemon of pool {self.name!r} is gone")

    def close(self) -> None:
        self.closed = True
        self.daemons.close()

    # -- a daemon died ----------------------------------------------------------

    def _lose(self, name: str) -> None:
        """Daemon ``name`` is gone: its sessions are lost (or attached elsewhere),
        and an attach in flight to it goes on to the next daemon."""
        member = self.members[name]
        if member.closed:
            return
        with contextlib.suppress(Exception):
            member.close()
        why = f"EngineGone: daemon {name!r} of the pool died; its sessions are lost"
        lost = [session for session, _ in self.home.lose(name)]
        self.late_attaches.lost(name)
        for session in lost:
            self._lost[session] = why
            self._pending += [Gone(session), Notice(session, NoticeKind.ERROR, why)]
        self.placer.died(name, self._pending.append)
        if self.reattach:
            states = self._checkpointed(name)
            for session in lost:
                self._reattach(session, states.get(session))

    def _checkpointed(self, name: str) -> Mapping[str, SessionState]:
        """The dead daemon ``name``'s checkpointed states ({} without ``recover``, or
        when it wrote none: its sessions restart at chunk 0)."""
        if self.recover is None:
            return {}
        try:
            return self.recover(name)
        except RteError as exc:  # none written, or refused (torn, foreign): never loaded
            log.warning("pool %r: no checkpoint of %r to reattach from: %s", self.name, name, exc)
            return {}

    def _reattach(self, session: str, state: SessionState | None = None) -> None:
        conditioning = self._last.get(session, {}) if state is None else with_state({}, state)
        free = {name: self.free_rows(name) for name in self.live()}
        for name in self.home.choices(session, free):  # (lost: placed nowhere now)
            member = self.members[name]
            request = Attach(session, dict(conditioning), self._numbering())
            try:
                member.send(member.lend(request, 0.0), 0.0)
            except RteError:
                continue
            self._reattaching[request.seq] = session  # its ATTACHED makes it home again
            if state is not None:
                self._from_chunk[request.seq] = state.chunk - len(state.pending)
            return


def _kept(request: Request) -> dict[str, Any]:
    """``request``'s conditioning as a reattach sends it again (what went by slot
    is the daemon's: not kept)."""
    return {k: v for k, v in (conditioning_of(request) or {}).items() if type(v) is not InputRef}


class PoolClient(Migrating):
    """Clients of the daemons ``names``, as one; build it with
    :func:`rte.client.connect_pool` (or ``connect("NAME")`` for ``NAME-*``).

    Attributes (its transport's): ``members`` (name -> that daemon's transport),
    ``missing`` (daemons down when last tried), ``home`` (session -> its daemon),
    ``reattach``, ``stranded``; :meth:`live` and :meth:`free_rows`; :meth:`migrate`
    and :meth:`drain` move sessions between them, and a session whose daemon
    drains (``rte drain``) is moved at the next ``poll``, ``poll_batch``,
    ``results`` or ``notices``, its DRAINING notice then saying where it went
    (:mod:`rte.client.migration`).
    """

    transport: PoolTransport

    def __init__(
        self,
        names: list[str],
        *,
        timeout: float | None = None,
        reattach: bool = False,
        recover: Recover | None = None,
    ) -> None:
        super().__init__(PoolTransport(names, timeout=timeout, reattach=reattach, recover=recover))
        pool = self.transport
        self.members, self.missing, self.home = pool.members, pool.missing, pool.home
        self.reattach = reattach
        self._moving = False  # a drain's moves are being advanced (never re-entered)
        self._drained = MovesInFlight(self._core, pool, DRAIN_ROOM_S)
        pool.late_attaches.stranded = self.stranded  # (a late attach adopted: not stranded)

    def live(self) -> list[str]:
        return self.transport.live()

    def free_rows(self, name: str) -> int:
        """Rows of daemon ``name`` no client's session holds (its table says)."""
        return self.transport.free_rows(name)
