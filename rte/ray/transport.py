"""RayTransport: a caller's sessions over a Ray cluster's daemons, as one transport.

Beneath the one client core (:mod:`rte.client.transport`), so
:class:`~rte.ray.client.RayClient` is an :class:`~rte.client.base.EngineClient`
with every behaviour of the other forms. Each host is a member, opened at the
first attach placed on it (:mod:`rte.ray.members` opens and keeps them):

- **on this caller's node**: a :class:`~rte.client.shm.ShmTransport` of that
  daemon, by name, as any local client: its chunks are read in place and
  released in one C call, and a caller with only such members waits on that
  ring alone (spin, then its FIFO), never on another host;
- **on another node**: a :class:`~rte.ray.remote.RemoteMember`, whose host
  pushes the caller's arrivals (a message per wake-up) and takes its requests
  and gathered releases as actor calls not waited on.

An attach is placed by the :class:`~rte.ray.hosting.Router` (sticky, most free
rows; one actor call per attach); every other request goes to its session's
member without asking anyone. A member found gone (its daemon died, its node
was removed: the stream ended, the FIFO closed) loses its sessions alone: each
gets :class:`~rte.client.transport.Gone` and an ERROR notice saying
``EngineGone``, calls naming them raise it, the router is told, and an attach
places them again on a live host. The router's own health checks are read too,
without waiting, every :data:`CHECK_EVERY_S`.

A session's state moves with its member's way: an export of a session on this
node goes into a slot of this caller's input segment at that daemon (as any
local client's); one elsewhere comes as the host's ObjectRef, fetched when the
caller reads it (:mod:`rte.ray.remote`). For :class:`~rte.client.migration.Migrating`
(``RayClient.migrate``, ``drain``) the transport has a pool's shape, by daemon
name: :attr:`members` (name -> host), :attr:`home` (session -> its daemon's
name), :meth:`live`, :meth:`free_rows` and :attr:`pinned` (session -> the
daemons an attach may go to, in order: each refusal passes it to the next,
and the caller sees the last one).
"""

from __future__ import annotations

import contextlib
import select
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rte.client.batch import ChunkBatch, Release
from rte.client.inputs import InputLoan, loan_layout
from rte.client.late_attaches import LateAttaches
from rte.client.shm import ShmTransport, SlotLease
from rte.client.transport import Arrival, Gone, Numbering, Transport, send_lent
from rte.contract import Notice, NoticeKind
from rte.errors import EngineGone, UnknownSessionError
from rte.protocol.requests import Attach, Detach, Export, Request
from rte.ray.members import PLACE_TIMEOUT_S, Member, Members
from rte.ray.remote import RemoteLease, RemoteMember
from rte.ray.window import WINDOW
from rte.state import SessionState

CHECK_EVERY_S = 0.25  # how often the router's losses are read (and a sleep is cut)


@dataclass(frozen=True)
class Placing:
    """An attach in flight: its session, the host it went to, the request as the
    caller made it (sent again to the next of ``rest`` when refused: a move)."""

    session: str
    index: int
    request: Attach
    rest: tuple[int, ...] = ()


class Homes(Mapping[str, str]):
    """Session -> the name of its host's daemon: a view of ``at`` (session -> host)."""

    def __init__(self, at: dict[str, int], places: list[tuple[str, str]]) -> None:
        self.at, self.places = at, places

    def __getitem__(self, session: str) -> str:
        return self.places[self.at[session]][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self.at)

    def __len__(self) -> int:
        return len(self.at)


class RayTransport(Transport):
    """The daemons of ``hosts`` (placed by ``router``) as one transport; see the module."""

    def __init__(self, router: Any, hosts: list[Any], window: int = WINDOW) -> None:
        import ray  # noqa: PLC0415 (the optional extra)

        self.ray, self.router, self.hosts = ray, router, hosts
        self.owner = uuid.uuid4().hex
        self.node = ray.get_runtime_context().get_node_id()
        self.places: list[tuple[str, str]] = ray.get([h.where.remote() for h in hosts])
        self.name = "+".join(daemon for daemon, _ in self.places)
        self.manifest = ray.get(hosts[0].manifest.remote(), timeout=PLACE_TIMEOUT_S)
        self.by_host = Members(ray, hosts, self.places, self.node, self.owner, window)
        self.at: dict[str, int] = {}  # session -> its host, once ATTACHED
        self.home = Homes(self.at, self.places)  # session -> its daemon's name
        self.members = {daemon: i for i, (daemon, _) in enumerate(self.places)}
        self.pinned: dict[str, list[str]] = {}  # session -> the daemons it may go to (a move)
        self.lost: dict[str, str] = {}  # session -> why (its host died)
        self.told: list[str] = []  # sessions whose daemon said it drains: to move
        self.late_attaches = LateAttaches(self._given_up, self._detach_copy)  # a move's, late
        self._numbering: Numbering = lambda: 0
        self._placing: dict[int, Placing] = {}  # seq of an attach -> where it went
        self._exporting: dict[int, Member] = {}  # seq of an export -> its session's member
        self._detaching: set[int] = set()  # seqs of detaches in flight
        self._pending: list[Arrival] = []  # what lost sessions leave, to hand out
        self._asking = router.lost.remote(self.owner)
        self._next_check = time.monotonic() + CHECK_EVERY_S

    def number_with(self, numbering: Numbering) -> None:
        self._numbering = numbering

    def _given_up(self, seq: int) -> str:
        """A move's attach ``seq`` given up on: its daemon, no longer placed."""
        placing = self._placing.pop(seq, None)
        return "" if placing is None else self.places[placing.index][0]

    def _detach_copy(self, name: str, session: str) -> int:
        """A DETACH of daemon ``name``'s late copy of ``session``; its seq (0: not sent)."""
        request = Detach(session, seq=self._numbering())
        try:
            self.by_host.get(self.members[name]).send(request, 0.0)
        except Exception:
            return 0
        return request.seq

    def local(self, index: int) -> bool:
        return self.by_host.local(index)

    def path(self, session: str) -> str:
        """``"shm"``: its daemon is on this node (in place); ``"ray"``: elsewhere."""
        return "shm" if self.local(self.at[session]) else "ray"

    def live(self) -> list[str]:
        """The daemons whose hosts are not lost, by name."""
        return [d for i, (d, _) in enumerate(self.places) if i not in self.by_host.gone]

    def free_rows(self, name: str) -> int:
        """Rows of daemon ``name`` no session holds (its host says; 0 if it cannot)."""
        try:
            rows: int = self.ray.get(
                self.hosts[self.members[name]].free_rows.remote(), timeout=PLACE_TIMEOUT_S
            )
        except Exception:  # a host that cannot say has no room to offer
            return 0
        return rows

    # -- requests out -----------------------------------------------------------

    def send(self, request: Request, room_s: float = 0.0) -> None:
        session = request.session
        if isinstance(request, Attach):
            return self._place(request, room_s)
        if session in self.lost:
            raise EngineGone(self.lost[session])
        index = self.at.get(session)
        if index is None:  # not attached: any host answers so
            index = next(i for i in range(len(self.hosts)) if i not in self.by_host.gone)
        if isinstance(request, Detach | Export):  # (an export detaches it too)
            self._detaching.add(request.seq)
        try:
            self.by_host.get(index).send(request, room_s)
        except EngineGone:
            self._lose(index, f"EngineGone: daemon {self.places[index][0]!r} is gone")
            raise

    def _place(self, request: Attach, room_s: float) -> None:
        session = request.session
        pinned = self.pinned.get(session)
        if pinned is None:
            ask = self.router.admit.remote(session, self.owner)
            try:
                index: int = self.ray.get(ask, timeout=PLACE_TIMEOUT_S)
            except self.ray.exceptions.RayTaskError as exc:  # AdmissionError: every host full
                raise exc.cause from None  # (the router's own, without Ray's traceback)
            rest: tuple[int, ...] = ()
        else:  # a move: to these alone, in order (the router told, not asked)
            live = [self.members[n] for n in pinned if self.members[n] not in self.by_host.gone]
            if not live:
                raise EngineGone(f"no daemon of {pinned} is live for {session!r}")
            index, rest = live[0], tuple(live[1:])
            self.router.settle.remote(session, index, self.owner)
        self._send_attach(request, index, room_s)
        self.lost.pop(session, None)
        self._placing[request.seq] = Placing(session, index, request, rest)

    def _send_attach(self, request: Attach, index: int, room_s: float) -> None:
        session = request.session
        try:
            member = self.by_host.get(index)
            if isinstance(member, ShmTransport):
                send_lent(member, request, room_s)
            else:
                member.send(request, room_s)
        except BaseException:
            if session not in self.at:
                self.router.release.remote(session)
            raise

    def loan(self, shape: tuple[int, ...], dtype: Any, timeout: float) -> InputLoan:
        shape, dtype, _ = loan_layout(shape, dtype)  # its host is not known yet
        return InputLoan(np.empty(shape, dtype), None)

    def lend(self, request: Request, timeout: float) -> Request:
        """Through its daemon's input slab when that is on this node (a remote host
        lends what it is sent by value; an attach is lent where it is placed)."""
        member = self._local_home(request)
        return request if member is None else member.lend(request, timeout)

    def unlend(self, request: Request) -> None:
        member = self._local_home(request)
        if member is not None:
            member.unlend(request)

    def export_into(self, request: Export, timeout: float) -> Export:
        """Into a slot of this caller's input segment at its daemon, on this node;
        elsewhere as it is (its host lends the slot, and hands back an ObjectRef)."""
        index = self.at.get(request.session)
        if index is None or index in self.by_host.gone or index not in self.by_host.open:
            raise UnknownSessionError(f"session {request.session!r} is not attached")
        member = self.by_host.open[index]
        lent = member.export_into(request, timeout) if isinstance(member, ShmTransport) else request
        self._exporting[lent.seq] = member
        return lent

    def exported(self, request: Export, nbytes: int) -> SessionState:
        member = self._exporting[request.seq]
        if isinstance(member, ShmTransport):
            return member.exported(request, nbytes)
        return member.state(request.seq)  # (from the object store)

    def export_done(self, request: Export) -> None:
        member = self._exporting.pop(request.seq, None)
        if isinstance(member, ShmTransport):
            if not member.closed:
                member.export_done(request)
        elif member is not None:
            member.forget(request.seq)

    def _local_home(self, request: Request) -> ShmTransport | None:
        index = None if isinstance(request, Attach) else self.at.get(request.session)
        member = self.by_host.open.get(index) if index is not None else None
        return member if isinstance(member, ShmTransport) and not member.closed else None

    # -- arrivals in ------------------------------------------------------------

    def receive(self, release: Release) -> list[Arrival]:
        self._watch()
        out: list[Arrival] = []
        lates = self.late_attaches
        for index, member in self.by_host.live():
            if isinstance(member, RemoteMember):
                # (nothing came: the caller has caught up, and its host may be stalled
                # for what it released; a caller that polls without waiting never sleeps)
                member.flush(force=not member.ready())
                items, ended = member.receive(release)
            else:
                try:
                    items, ended = member.receive(release), ""
                except EngineGone as exc:
                    items, ended = [], f"EngineGone: {exc}"
            name = self.places[index][0]
            for item in items:
                if isinstance(item, Notice):  # (first: a move's late attach, or its copy's)
                    shown = lates.sort(name, item) if lates else item
                    if shown is not None and (answer := self._sorted(index, shown)) is not None:
                        out.append(answer)
                elif isinstance(item, ChunkBatch) and lates.copies:
                    out += lates.without_copies(name, item, release, self.give_back)
                else:
                    out.append(item)
            if ended:
                self._lose(index, ended)
        if lates.copies:
            lates.retry()
        out += self._pending
        self._pending = []
        if not out and self.by_host.all_gone():
            raise EngineGone(f"every daemon of {self.name!r} is gone")
        return out

    def _sorted(self, index: int, item: Notice) -> Notice | None:
        """Keep the sessions' homes by the answers (the core sorts the rest); None
        when the answer is not the caller's yet (a move refused, tried on the next)."""
        placing = self._placing.pop(item.seq, None) if item.seq else None
        session = item.session
        if item.kind is NoticeKind.ATTACHED:
            self.at[session] = index
        elif placing is not None and item.kind in (NoticeKind.REJECTED, NoticeKind.ERROR):
            if session not in self.at:
                self.router.release.remote(session)
            if item.kind is NoticeKind.REJECTED and placing.rest:
                return self._next_target(placing, item)
        elif item.kind is NoticeKind.DETACHED and (not item.seq or item.seq in self._detaching):
            self._detaching.discard(item.seq)
            if self.at.pop(session, None) is not None:  # (a reset's DETACHED: not here)
                self.router.release.remote(session)
        elif item.kind is NoticeKind.ERROR:
            self._detaching.discard(item.seq)
        elif item.kind is NoticeKind.DRAINING and self.at.get(session) == index:
            self.told.append(session)  # (RayClient moves it at its next call)
        return item

    def _next_target(self, placing: Placing, refused: Notice) -> Notice | None:
        """A move refused by one target goes to the next (None); the last refusal,
        or a send that failed, is the caller's answer."""
        index, rest = placing.rest[0], placing.rest[1:]
        self.router.settle.remote(placing.session, index, self.owner)
        try:
            self._send_attach(placing.request, index, 0.0)
        except Exception:  # (that one cannot be reached either: the refusal stands)
            return refused
        self._placing[placing.request.seq] = Placing(placing.session, index, placing.request, rest)
        return None

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:  # (releases go back at the receive, or before a sleep: arm)
            self._watch()
            if self._pending or self.by_host.ready():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            budget = min(left, CHECK_EVERY_S)
            live = [m for _, m in self.by_host.live()]
            if len(live) == 1 and isinstance(live[0], ShmTransport):
                try:  # the one daemon is this node's: its own wait (spin, then its FIFO)
                    if live[0].wait(budget):
                        return True
                except EngineGone:
                    return True  # receive says so
            elif live:
                self._sleep(budget)
            else:
                time.sleep(budget)

    def _sleep(self, budget: float) -> None:
        fds = self.wake_fds()
        if self.arm():
            return
        try:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            poller.poll(budget * 1000)
        finally:
            self.disarm()

    def give_back(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        lease = batch.lease
        if isinstance(lease, RemoteLease):
            lease.member.give_back(lease.ident, rows)
        elif isinstance(lease, SlotLease) and not lease.transport.closed:
            lease.transport.give_back(batch, rows)

    # -- waiting on an event loop -------------------------------------------

    def wake_fds(self) -> list[int]:
        return self.by_host.wake_fds()

    def arm(self) -> bool:
        """Before any sleep: every release gathered goes to its host (its sessions
        may be stalled for them), then the local members are armed."""
        self.by_host.flush()
        return bool(self._pending) or self.by_host.ready() or self.by_host.arm()

    def disarm(self) -> bool:
        for index, why in self.by_host.disarm():
            self._lose(index, why)
        return True

    def check_live(self, alive: bool = True) -> None:
        if self.by_host.all_gone() and not self._pending:
            raise EngineGone(f"every daemon of {self.name!r} is gone")

    # -- a host lost ------------------------------------------------------------

    def _watch(self) -> None:
        """The router's word on lost hosts, read when it has come (never waited on)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        ready, _ = self.ray.wait([self._asking], timeout=0)
        if not ready:
            return
        with contextlib.suppress(Exception):  # (the router's node is this one: it lives)
            for session, index in self.ray.get(self._asking):
                if self.at.get(session) == index:
                    daemon = self.places[index][0]
                    self._lose(index, f"EngineGone: the node of daemon {daemon!r} is gone")
        self._asking = self.router.lost.remote(self.owner)

    def _lose(self, index: int, why: str) -> None:
        """Host ``index`` is gone: its sessions alone are lost; the router is told."""
        if not self.by_host.lose(index, why):
            return
        self.late_attaches.lost(self.places[index][0])
        self.router.forsake.remote(index)
        for session in [s for s, i in self.at.items() if i == index]:
            del self.at[session]
            self.lost[session] = why
            self._pending += [Gone(session), Notice(session, NoticeKind.ERROR, why)]
        for seq, placing in list(self._placing.items()):
            if placing.index == index:
                del self._placing[seq]
                self._pending.append(Notice(placing.session, NoticeKind.REJECTED, why, seq))

    # -- leaving --------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.by_host.close()
        for session in self.at:
            self.router.release.remote(session)
        self.at.clear()
