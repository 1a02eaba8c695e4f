"""PoolClient: one client interface over several daemons (one per GPU, say).

    from rte.client import connect_pool

    with connect_pool(["gpu-0", "gpu-1"]) as client:   # or connect("gpu"): finds gpu-*
        client.attach("alice", {"prompt": "a forest"})  # to the daemon with most room
        for chunk in client.results(timeout=1.0): ...

Sessions are sticky: a session lives on the daemon it was admitted to, and
every request about it goes there. Admission goes to the daemon with the most
free rows (then the fewest of this pool's sessions); a daemon that refuses
(full meanwhile) passes the attach to the next; a pool with no room raises
AdmissionError.

Each member is a :class:`~rte.client.shm.ShmClient` woken through its FIFO
(``wake="fd"``), so one wait covers every daemon: the pool announces a sleep
on each member's ring and polls all their descriptors at once. When a daemon
dies, only its sessions are lost: each gets an ERROR notice that says
``EngineGone`` and which daemon, calls naming them raise
:class:`~rte.errors.EngineGone`, and the other daemons' sessions go on without
a gap. With ``reattach=True`` the pool attaches them again elsewhere with
their last conditioning (their stream restarts at chunk 0; an ATTACHED notice
says where), as far as there is room.
"""

from __future__ import annotations

import contextlib
import select
import time
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from rte.client.base import EngineClient, R, until_admitted
from rte.client.batch import ChunkBatch
from rte.client.shm import ShmClient
from rte.contract import Notice, NoticeKind
from rte.errors import AdmissionError, EngineGone, RteError
from rte.overload import DEFAULT_PRIORITY
from rte.protocol.claims import ClientState
from rte.protocol.inputs import conditioning_of
from rte.protocol.requests import Act, Attach, Request, Reset
from rte.protocol.values import InputRef

CHECK_EVERY_S = 0.1  # a sleeping pool checks its daemons' liveness this often


class PoolClient(EngineClient):
    """Clients of the daemons ``names``, as one; build it with
    :func:`rte.client.connect_pool` (or ``connect("NAME")`` for ``NAME-*``)."""

    def __init__(
        self, names: list[str], *, timeout: float | None = None, reattach: bool = False
    ) -> None:
        if not names:
            raise ValueError("a pool needs at least one daemon")
        self._pending: list[ChunkBatch | Notice] = []  # notices of lost sessions, to hand out
        self.members: dict[str, ShmClient] = {}
        self.missing: list[str] = []  # daemons down when tried: tried again at each attach
        gone: list[str] = []
        try:
            for name in names:
                try:
                    self.members[name] = ShmClient(name, timeout=timeout, wake="fd")
                except EngineGone as exc:  # down (restarting, say): the pool goes on without
                    self.missing.append(name)
                    gone.append(str(exc))
        except BaseException:
            for member in self.members.values():
                member.close()
            raise
        if not self.members:
            raise EngineGone(f"no daemon of the pool is up: {'; '.join(gone)}")
        first = next(iter(self.members))
        manifest = self.members[first].manifest
        for name, member in self.members.items():
            m = member.manifest
            if (m.latent_shape, m.latent_dtype) != (manifest.latent_shape, manifest.latent_dtype):
                self._close_members()
                raise RteError(
                    f"daemon {name!r} makes {m.latent_dtype}{m.latent_shape} chunks, "
                    f"{first!r} {manifest.latent_dtype}{manifest.latent_shape}: not one pool"
                )
        super().__init__("+".join(names), manifest)
        self.reattach = reattach
        self.home: dict[str, str] = {}  # session -> the daemon it lives on
        self._lost: dict[str, str] = {}  # session -> why (its daemon died)
        self._last: dict[str, dict[str, Any]] = {}  # session -> its conditioning, merged
        self._choice: str | None = None  # the daemon an attach in flight goes to
        self._reattaching: dict[int, str] = {}  # seq of a reattach -> its session

    # -- admission ------------------------------------------------------------

    def live(self) -> list[str]:
        return [n for n, m in self.members.items() if not m.closed]

    def free_rows(self, name: str) -> int:
        """Rows of daemon ``name`` no client's session holds (its table says)."""
        member = self.members[name]
        held = sum(e.sessions for e in member._table.entries() if e.state is ClientState.ACTIVE)
        return member.manifest.max_sessions - held

    def attach(
        self,
        session: str,
        conditioning: Mapping[str, Any] | None = None,
        *,
        credits: int = 0,
        timeout: float = 5.0,
        priority: int = DEFAULT_PRIORITY,
        wait: float = 0.0,
    ) -> None:
        """As :meth:`EngineClient.attach`, on the daemon with the most free rows; a
        daemon that refuses (rows, or its real-time capacity) passes it to the next.
        ``wait``: seconds to keep trying them all while every one refuses."""
        until_admitted(
            lambda: self._attach_once(session, conditioning, credits, timeout, priority), wait
        )

    def _attach_once(
        self,
        session: str,
        conditioning: Mapping[str, Any] | None,
        credits: int,
        timeout: float,
        priority: int,
    ) -> None:
        self._check_open()
        self._rejoin()
        if not self.live():
            raise EngineGone(f"every daemon of pool {self.name!r} is gone")
        mine = {n: 0 for n in self.members}
        for name in self.home.values():
            mine[name] += 1
        order = sorted(self.live(), key=lambda n: (-self.free_rows(n), mine[n]))
        if session in self.home:  # attached already: the daemon says so
            order = [self.home[session]]
        refused = []
        for name in order:
            self._choice = name
            try:
                super().attach(
                    session, conditioning, credits=credits, timeout=timeout, priority=priority
                )
            except AdmissionError as exc:
                refused.append(f"{name}: {exc}")
                continue
            except EngineGone:
                self._lose(name)
                continue
            finally:
                self._choice = None
            self.home[session] = name
            self._lost.pop(session, None)
            self._last[session] = dict(conditioning or {})
            return
        raise AdmissionError(
            "every daemon of the pool is full" + (f" ({'; '.join(refused)})" if refused else "")
        )

    # -- transport ------------------------------------------------------------

    def _send(self, request: Request, timeout: float) -> None:
        session = request.session
        if session in self._lost:
            raise EngineGone(self._lost[session])
        name = self._choice if isinstance(request, Attach) else self.home.get(session)
        if name is None:  # not ours: any daemon answers that it is not attached
            name = (self.live() or [""])[0]
            if not name:
                raise EngineGone(f"every daemon of pool {self.name!r} is gone")
        try:
            self.members[name]._send(request, timeout)
        except EngineGone:
            self._lose(name)
            raise
        # what a reattach sends again (a frame lent by slot is the daemon's: not kept)
        kept = {
            k: v for k, v in (conditioning_of(request) or {}).items() if type(v) is not InputRef
        }
        if isinstance(request, Reset) and request.conditioning is not None:
            self._last[session] = kept  # replaced whole
        elif isinstance(request, Act) and session in self._last:
            self._last[session].update(kept)

    def _receive(self, timeout: float) -> list[ChunkBatch | Notice]:
        out = self._collect()
        if not out and not self.live():  # (what was pending is handed out first)
            raise EngineGone(f"every daemon of pool {self.name!r} is gone")
        if out or timeout <= 0:
            return out
        deadline = time.monotonic() + timeout
        while not out:
            left = deadline - time.monotonic()
            if left <= 0 or not self.live():
                break
            self._sleep(min(left, CHECK_EVERY_S))
            out = self._collect()
        return out

    def _sleep(self, budget: float) -> None:
        """Announce a sleep on every member, then wait on all their descriptors."""
        armed = []
        try:
            for name in self.live():
                if self.members[name]._arm():
                    return  # something came meanwhile
                armed.append(name)
            poller = select.poll()
            for name in armed:
                poller.register(self.members[name]._wake_fd(), select.POLLIN)
            poller.poll(budget * 1000)
        finally:
            for name in armed:
                member = self.members[name]
                alive = member._disarm()
                try:
                    member._check_live(alive)
                except EngineGone:
                    self._lose(name)

    def _collect(self) -> list[ChunkBatch | Notice]:
        out: list[ChunkBatch | Notice] = []
        for name in self.live():
            member = self.members[name]
            try:
                items = member._receive(0.0)
            except EngineGone:
                self._lose(name)
                continue
            for item in items:
                if isinstance(item, ChunkBatch):
                    item.lease = (member, item.lease)
                    item._release = self._release_rows
                elif item.kind is NoticeKind.ATTACHED:
                    self.home[item.session] = name
                    self._lost.pop(item.session, None)
                    self._reattaching.pop(item.seq, None)
                elif self._reattaching.pop(item.seq, None) is not None:
                    pass  # a reattach refused: the session stays lost
                elif item.kind is NoticeKind.DETACHED and self.home.get(item.session) == name:
                    del self.home[item.session]  # (a reset's ATTACHED, next, puts it back)
                out.append(item)
        out += self._pending
        self._pending = []
        return out

    def _give_back(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        member, lease = batch.lease
        if not member.closed:
            member._give_back(types.SimpleNamespace(lease=lease), rows)  # (it reads .lease)

    def _shutdown(self) -> None:
        self._close_members()

    def _close_members(self) -> None:
        for member in self.members.values():
            with contextlib.suppress(Exception):
                member.close()

    # -- a daemon died ----------------------------------------------------------

    def _lose(self, name: str) -> None:
        """Daemon ``name`` is gone: its sessions are lost (or attached elsewhere)."""
        member = self.members[name]
        if member.closed:
            return
        with contextlib.suppress(Exception):
            member.close()
        why = f"EngineGone: daemon {name!r} of the pool died; its sessions are lost"
        lost = [s for s, home in self.home.items() if home == name]
        pending: list[ChunkBatch | Notice] = []
        for session in lost:
            del self.home[session]
            self.sessions.discard(session)
            self._lost[session] = why
            pending.append(Notice(session, NoticeKind.ERROR, why))
        self._pending += pending
        if self.reattach:
            for session in lost:
                self._reattach(session)

    def _reattach(self, session: str) -> None:
        conditioning = self._last.get(session, {})
        for name in sorted(self.live(), key=lambda n: -self.free_rows(n)):
            if self.free_rows(name) <= 0:
                continue
            request = Attach(session, dict(conditioning), self._next_seq())
            try:
                self.members[name]._send(self.members[name]._lend(request, 1.0), 1.0)
            except RteError:
                continue
            self._reattaching[request.seq] = session  # its ATTACHED makes it home again
            return

    def _rejoin(self) -> None:
        """Try the daemons that were down again (at once: no waiting)."""
        for name in list(self.missing):
            try:
                self.members[name] = ShmClient(name, timeout=0.0, wake="fd")
            except RteError:
                continue
            self.missing.remove(name)

    def detach(self, session: str, *, timeout: float = 5.0) -> None:
        super().detach(session, timeout=timeout)
        self._last.pop(session, None)

    # -- inputs by slot: each through its session's daemon's input slab -----------

    def _lend(self, request: R, timeout: float) -> R:
        name = self._choice if isinstance(request, Attach) else self.home.get(request.session)
        member = self.members.get(name or "")
        return request if member is None or member.closed else member._lend(request, timeout)

    def _unlend(self, request: Request) -> None:
        name = self._choice if isinstance(request, Attach) else self.home.get(request.session)
        member = self.members.get(name or "")
        if member is not None and not member.closed:
            member._unlend(request)

    def _wake_fd(self) -> int:
        raise RteError("a pool waits on several descriptors: use it from a thread, not asyncio")

    def _arm(self) -> bool:
        return False

    def _disarm(self) -> bool:
        return True

    def _check_live(self, alive: bool = True) -> None:
        if not self.live():
            raise EngineGone(f"every daemon of pool {self.name!r} is gone")
