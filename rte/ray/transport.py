"""RayTransport: a caller's sessions over a Ray cluster's daemons, as one transport.

Beneath the one client core (:mod:`rte.client.transport`), so
:class:`~rte.ray.client.RayClient` is an :class:`~rte.client.base.EngineClient`
with every behaviour of the other forms. Each host is a member, opened at the
first attach placed on it:

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
"""

from __future__ import annotations

import contextlib
import select
import time
import uuid
from typing import Any

import numpy as np

from rte.client.batch import ChunkBatch, Release
from rte.client.inputs import InputLoan, loan_layout
from rte.client.shm import ShmTransport, SlotLease
from rte.client.transport import Arrival, Gone, Transport
from rte.contract import Notice, NoticeKind
from rte.errors import EngineGone
from rte.protocol.requests import Attach, Detach, Request
from rte.ray.remote import RemoteLease, RemoteMember

CHECK_EVERY_S = 0.25  # how often the router's losses are read (and a sleep is cut)
PLACE_TIMEOUT_S = 30.0

Member = ShmTransport | RemoteMember


class RayTransport(Transport):
    """The daemons of ``hosts`` (placed by ``router``) as one transport; see the module."""

    def __init__(self, router: Any, hosts: list[Any]) -> None:
        import ray  # noqa: PLC0415 (the optional extra)

        self.ray, self.router, self.hosts = ray, router, hosts
        self.owner = uuid.uuid4().hex
        self.node = ray.get_runtime_context().get_node_id()
        self.places: list[tuple[str, str]] = ray.get([h.where.remote() for h in hosts])
        self.name = "+".join(daemon for daemon, _ in self.places)
        self.manifest = ray.get(hosts[0].manifest.remote(), timeout=PLACE_TIMEOUT_S)
        self.members: dict[int, Member] = {}
        self.gone: dict[int, str] = {}  # host -> why it is lost
        self.home: dict[str, int] = {}  # session -> its host, once ATTACHED
        self.lost: dict[str, str] = {}  # session -> why (its host died)
        self._placing: dict[int, tuple[str, int]] = {}  # seq of an attach -> (session, host)
        self._detaching: set[int] = set()  # seqs of detaches in flight
        self._pending: list[Arrival] = []  # what lost sessions leave, to hand out
        self._asking = router.lost.remote(self.owner)
        self._next_check = time.monotonic() + CHECK_EVERY_S

    def local(self, index: int) -> bool:
        return self.places[index][1] == self.node

    def path(self, session: str) -> str:
        """``"shm"``: its daemon is on this node (in place); ``"ray"``: elsewhere."""
        return "shm" if self.local(self.home[session]) else "ray"

    def _member(self, index: int) -> Member:
        if index in self.gone:
            raise EngineGone(self.gone[index])
        member = self.members.get(index)
        if member is None:
            daemon = self.places[index][0]
            if self.local(index):
                member = ShmTransport(daemon, timeout=PLACE_TIMEOUT_S, wake="fd")
            else:
                member = RemoteMember(self.ray, self.hosts[index], daemon, self.owner)
            self.members[index] = member
        return member

    # -- requests out -----------------------------------------------------------

    def send(self, request: Request, room_s: float = 0.0) -> None:
        session = request.session
        if isinstance(request, Attach):
            return self._place(request, room_s)
        if session in self.lost:
            raise EngineGone(self.lost[session])
        index = self.home.get(session)
        if index is None:  # not attached: any host answers so
            index = next(i for i in range(len(self.hosts)) if i not in self.gone)
        if isinstance(request, Detach):
            self._detaching.add(request.seq)
        try:
            self._member(index).send(request, room_s)
        except EngineGone:
            self._lose(index, f"EngineGone: daemon {self.places[index][0]!r} is gone")
            raise

    def _place(self, request: Attach, room_s: float) -> None:
        session = request.session
        ask = self.router.admit.remote(session, self.owner)
        try:
            index: int = self.ray.get(ask, timeout=PLACE_TIMEOUT_S)
        except self.ray.exceptions.RayTaskError as exc:  # AdmissionError: every host full
            raise exc.cause from None  # (the router's own, without Ray's traceback)
        try:
            member = self._member(index)
            if isinstance(member, ShmTransport):
                lent = member.lend(request, room_s)
                try:
                    member.send(lent, room_s)
                except BaseException:
                    member.unlend(lent)
                    raise
            else:
                member.send(request, room_s)
        except BaseException:
            if session not in self.home:
                self.router.release.remote(session)
            raise
        self.lost.pop(session, None)
        self._placing[request.seq] = (session, index)

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

    def _local_home(self, request: Request) -> ShmTransport | None:
        index = None if isinstance(request, Attach) else self.home.get(request.session)
        member = self.members.get(index) if index is not None else None
        return member if isinstance(member, ShmTransport) and not member.closed else None

    # -- arrivals in ------------------------------------------------------------

    def receive(self, release: Release) -> list[Arrival]:
        self._watch()
        out: list[Arrival] = []
        for index, member in list(self.members.items()):
            if index in self.gone:
                continue
            if isinstance(member, RemoteMember):
                member.flush()
                items, ended = member.receive(release)
            else:
                try:
                    items, ended = member.receive(release), ""
                except EngineGone as exc:
                    items, ended = [], f"EngineGone: {exc}"
            out += [self._sorted(index, i) if isinstance(i, Notice) else i for i in items]
            if ended:
                self._lose(index, ended)
        out += self._pending
        self._pending = []
        if not out and len(self.gone) == len(self.hosts):
            raise EngineGone(f"every daemon of {self.name!r} is gone")
        return out

    def _sorted(self, index: int, item: Notice) -> Notice:
        """Keep the sessions' homes by the answers (the core sorts the rest)."""
        placing = self._placing.pop(item.seq, None) if item.seq else None
        session = item.session
        if item.kind is NoticeKind.ATTACHED:
            self.home[session] = index
        elif placing is not None and item.kind in (NoticeKind.REJECTED, NoticeKind.ERROR):
            if session not in self.home:
                self.router.release.remote(session)
        elif item.kind is NoticeKind.DETACHED and (not item.seq or item.seq in self._detaching):
            self._detaching.discard(item.seq)
            if self.home.pop(session, None) is not None:  # (a reset's DETACHED: not here)
                self.router.release.remote(session)
        elif item.kind is NoticeKind.ERROR:
            self._detaching.discard(item.seq)
        return item

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self._flush()
            self._watch()
            if self._pending or self._ready():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            budget = min(left, CHECK_EVERY_S)
            live = [m for i, m in self.members.items() if i not in self.gone]
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

    def _ready(self) -> bool:
        return any(m.ready() for i, m in self.members.items() if i not in self.gone)

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

    def _flush(self) -> None:
        for member in self.members.values():
            if isinstance(member, RemoteMember):
                member.flush()

    # -- waiting on an event loop -------------------------------------------

    def wake_fds(self) -> list[int]:
        fds = []
        for index, member in self.members.items():
            if index not in self.gone:
                fds += member.wake_fds() if isinstance(member, ShmTransport) else [member.wake_fd()]
        return fds

    def arm(self) -> bool:
        if self._pending or self._ready():
            return True
        for index, member in self.members.items():
            if index not in self.gone and isinstance(member, ShmTransport) and member.arm():
                self._disarm_until(index)
                return True
        return False

    def _disarm_until(self, stop: int) -> None:
        for index, member in self.members.items():
            if index == stop:
                return
            if index not in self.gone and isinstance(member, ShmTransport):
                member.disarm()

    def disarm(self) -> bool:
        for index, member in list(self.members.items()):
            if index in self.gone:
                continue
            if isinstance(member, RemoteMember):
                member.drain()
                continue
            alive = member.disarm()
            try:
                member.check_live(alive)
            except EngineGone as exc:
                self._lose(index, f"EngineGone: {exc}")
        return True

    def check_live(self, alive: bool = True) -> None:
        if len(self.gone) == len(self.hosts) and not self._pending:
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
                if self.home.get(session) == index:
                    daemon = self.places[index][0]
                    self._lose(index, f"EngineGone: the node of daemon {daemon!r} is gone")
        self._asking = self.router.lost.remote(self.owner)

    def _lose(self, index: int, why: str) -> None:
        """Host ``index`` is gone: its sessions alone are lost; the router is told."""
        if index in self.gone:
            return
        self.gone[index] = why
        member = self.members.get(index)
        if member is not None:
            with contextlib.suppress(Exception):
                member.close()
        self.router.forsake.remote(index)
        for session in [s for s, i in self.home.items() if i == index]:
            del self.home[session]
            self.lost[session] = why
            self._pending += [Gone(session), Notice(session, NoticeKind.ERROR, why)]
        for seq, (session, where) in list(self._placing.items()):
            if where == index:
                del self._placing[seq]
                self._pending.append(Notice(session, NoticeKind.REJECTED, why, seq))

    # -- leaving --------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for member in self.members.values():
            with contextlib.suppress(Exception):
                member.close()
        for session in self.home:
            self.router.release.remote(session)
        self.home.clear()
