"""RayClient: a caller anywhere in a Ray cluster, on one daemon per GPU.

    from rte.ray import RayClient, start_hosts

    hosts, router = start_hosts(["--model", "world"], count=4)   # one per rte_gpu
    client = RayClient(router, hosts)
    client.attach("alice", {"prompt": "a forest"})   # admitted by free rows, sticky
    for chunk in client.results(timeout=1.0): ...    # as from any EngineClient

An :class:`~rte.client.base.EngineClient` over a
:class:`~rte.ray.transport.RayTransport`: the same calls, answers, batches and
errors as a :class:`~rte.client.shm.ShmClient` (the behaviour tests run on
it). A session whose daemon is on this caller's node goes through shared
memory, as any local client of that daemon; one elsewhere has its chunks
pushed by its host, a message per step (``path`` says which). When a host's
node dies, its sessions alone are lost: an ERROR notice says ``EngineGone``,
calls naming them raise :class:`~rte.errors.EngineGone`, and ``attach`` admits
them again on a live daemon.

:meth:`RayClient.migrate` moves a session to another host (a daemon's name, a
node's id or a host's index) and :meth:`RayClient.drain` every session of this
caller off one, as a pool's do (:mod:`rte.client.migration`): exported where it
is, attached with its state there, its chunk indices going on with no gap or
repeat; a state leaving or reaching another node goes through Ray's object
store (:mod:`rte.ray.relay`). A move refused everywhere goes back where it was
(:class:`~rte.client.migration.MigrationError` holds the state if even that fails);
one whose attach got no answer in its time leaves no second copy where that
attach is taken up late (:mod:`rte.client.late_attaches`, as a pool's).

When a host's daemon drains (``rte drain NAME``: a DRAINING notice for each
of its sessions), the caller moves those sessions to the other live hosts at
its next ``poll``, ``poll_batch`` or ``notices``, all at once, as a pool
client does; one that no host takes is left in :attr:`RayClient.stranded`
(its state) with an ERROR notice saying so.

:meth:`RayClient.take` is the older convenience: every chunk that came, copied
out and released, as :class:`Frame` s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rte.client import arguments
from rte.client.base import EngineClient
from rte.client.batch import ChunkBatch
from rte.client.core import Chunk
from rte.client.in_flight import Landed, fly
from rte.client.migration import DRAIN_MOVE_S, MigrationError, Move, outcome
from rte.contract import Notice, NoticeKind
from rte.errors import EngineGone, RequestError, UnknownSessionError
from rte.ray.remote import RemoteLease
from rte.ray.transport import RayTransport
from rte.ray.window import WINDOW, check_window


@dataclass(frozen=True)
class Frame:
    session: str
    chunk: int
    latent: np.ndarray[Any, Any]
    path: str  # "shm": this node's daemon, in place; "ray": another node's, pushed by its host


Where = str | int  # a daemon's name, a node's id, or a host's index


class RayClient(EngineClient):
    """A caller's sessions over the hosts a router places them on.

    Attributes (its transport's): ``owner`` (this caller's id at the router and
    the hosts), ``places`` ((daemon, node) of each host), ``home`` (session ->
    its host's index), ``lost`` (session -> why its host is gone); and
    ``stranded`` (session -> its state: a session of a draining daemon that no
    host took; ``attach(s, state=client.stranded.pop(s))`` once one has room).

    ``window``: how many chunks a session on another node may run ahead of this
    caller beyond its credits (:mod:`rte.ray.window`; 0: none), so its chunks
    keep flowing while releases are a round trip away; more chunks per second,
    and a caller that stops reading stalls its session that many chunks later.
    """

    transport: RayTransport

    def __init__(self, router: Any, hosts: list[Any], *, window: int = WINDOW) -> None:
        check_window(window)  # (here: not as a host's refusal to open a slot)
        super().__init__(RayTransport(router, hosts, window))
        ray = self.transport
        self.router, self.hosts, self.owner = router, hosts, ray.owner
        self.places, self.home, self.lost = ray.places, ray.at, ray.lost
        self._moving = False  # (``stranded`` is EngineClient's: late exports' too)
        ray.late_attaches.stranded = self.stranded  # (a late attach adopted: not stranded)

    def path(self, session: str) -> str:
        """``"shm"`` when the session's daemon is on this node, else ``"ray"``."""
        return self.transport.path(session)

    def migrate(self, session: str, to: Where | Sequence[Where], *, timeout: float = 5.0) -> str:
        """Move ``session`` to host ``to`` (a daemon's name, a node's id, a host's
        index; or the first of several that takes it); the daemon it went to.
        Raises as :meth:`PoolClient.migrate <rte.client.pool.PoolClient.migrate>`."""
        ray = self.transport
        old = ray.home.get(session)
        if old is None or session not in self.sessions:
            raise UnknownSessionError(f"session {session!r} is not attached to {ray.name!r}")
        wanted = [to] if isinstance(to, str | int) else list(to)
        targets = [name for where in wanted for name in self._names(where)]
        for name in targets:
            if name == old:
                raise RequestError(f"session {session!r} lives on {name!r} already")
        if not any(name in ray.live() for name in targets):
            raise EngineGone(f"no daemon of {targets} is live: {session!r} stays on {old!r}")
        return outcome(self._fly([Move(session, old, targets)], timeout))[session]

    def drain(self, name: Where, *, timeout: float = 5.0) -> dict[str, str]:
        """Move every session of this caller off host ``name`` (a daemon's name, a
        node's id, a host's index) to the other live ones, most free rows first;
        session -> the daemon it went to. The first that cannot move raises as
        :meth:`migrate` does (those before it moved)."""
        ray, moves = self.transport, []
        for daemon in self._names(name):
            mine = sorted(s for s in self.sessions if ray.home.get(s) == daemon)
            moves += self._moves_off(daemon, mine)
        return outcome(self._fly(moves, timeout))

    def _moves_off(self, daemon: str, sessions: list[str]) -> list[Move]:
        """The moves of ``sessions`` off ``daemon``, spread over the other live
        hosts by free rows (each as if those before took a row); EngineGone when
        there is no other."""
        ray = self.transport
        free = {n: ray.free_rows(n) for n in ray.live() if n != daemon}
        if sessions and not free:
            raise EngineGone(f"draining {daemon!r}: no other host's daemon is live")
        moves = []
        for session in sessions:
            others = sorted(free, key=lambda n: free[n], reverse=True)
            free[others[0]] -= 1
            moves.append(Move(session, daemon, others))
        return moves

    # -- a host's daemon drains: its sessions move, at the caller's next call ----

    def poll(self, timeout: float = 1.0) -> Chunk | None:
        if self.transport.told:
            self.move_drained()
        return super().poll(timeout)

    def poll_batch(self, timeout: float = 1.0) -> ChunkBatch | None:
        if self.transport.told:
            self.move_drained()
        return super().poll_batch(timeout)

    def notices(self) -> list[Notice]:
        news = super().notices()
        if self.transport.told:
            self.move_drained()
            news += self._core.drain_notices()
        return news

    def move_drained(self, *, timeout: float = DRAIN_MOVE_S) -> dict[str, str]:
        """Move each session whose daemon said it drains to the other live hosts,
        all at once (``poll`` and the others call it); session -> where it went.
        One that cannot move gets an ERROR notice (its state, when no host took
        it, in :attr:`stranded`). Never re-entered."""
        ray = self.transport
        if self._moving or not ray.told:
            return {}
        self._moving = True
        told, ray.told = list(dict.fromkeys(ray.told)), []
        try:
            by_daemon: dict[str, list[str]] = {}
            for session in told:
                daemon = ray.home.get(session)
                if daemon is not None and session in self.sessions:
                    by_daemon.setdefault(daemon, []).append(session)
            moves: list[Move] = []
            for daemon, mine in by_daemon.items():
                try:
                    moves += self._moves_off(daemon, mine)
                except EngineGone as why:
                    self._core.sort([self._unmoved(s, daemon, why) for s in mine])
            landed = self._fly(moves, timeout) if moves else []
        finally:
            self._moving = False
        for move in (m for m in landed if m.error is not None):
            if isinstance(move.error, MigrationError):
                self.stranded[move.move.session] = move.error.state
            self._core.sort([self._unmoved(move.move.session, move.move.old, move.error)])
        return {m.move.session: m.to for m in landed if m.error is None}

    @staticmethod
    def _unmoved(session: str, daemon: str, why: Exception | None) -> Notice:
        text = f"daemon {daemon!r} drains and session {session!r} could not move: {why}"
        return Notice(session, NoticeKind.ERROR, text)

    def _fly(self, moves: list[Move], timeout: float) -> list[Landed]:
        """Every move at once (:mod:`rte.client.in_flight`), as a pool's."""
        return fly(self._core, self.transport, self._pump, moves, arguments.timeout(timeout))

    def _names(self, where: Where) -> list[str]:
        """The daemons ``where`` names: itself, those on that node, or that host's."""
        if isinstance(where, int) and not isinstance(where, bool):
            if not 0 <= where < len(self.places):
                raise RequestError(f"host {where} is not one of {len(self.places)} hosts")
            return [self.places[where][0]]
        on_node = [daemon for daemon, node in self.places if node == where]
        if on_node:
            return on_node
        if where not in self.transport.members:
            raise RequestError(f"{where!r} is neither a daemon nor a node of {self.name!r}")
        return [str(where)]

    def take(self, timeout: float = 1.0) -> list[Frame]:
        """Every chunk that came (waiting up to ``timeout`` s for the first), copied
        out and released."""
        frames: list[Frame] = []
        batch = self.poll_batch(timeout)
        while batch is not None:
            with batch:
                path = "ray" if isinstance(batch.lease, RemoteLease) else "shm"
                latents = np.array(batch.latents)
                for k, session in enumerate(batch.sessions):
                    frames.append(Frame(session, batch.chunk_index(k), latents[k], path))
            batch = self.poll_batch(0)
        return frames
