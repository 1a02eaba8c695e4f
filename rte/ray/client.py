"""RayClient: a caller anywhere in a Ray cluster, on one daemon per GPU.

    from rte.ray import RayClient, start_hosts

    hosts, router = start_hosts(["--model", "world"], count=4)   # one per rte_gpu
    client = RayClient(router, hosts)
    client.attach("alice", {"prompt": "a forest"})   # admitted by free rows, sticky
    for frame in client.take(timeout=1.0): ...       # Frame(session, chunk, latent, path)

A session whose daemon is on this caller's node goes through shared memory,
exactly as any local client (a :class:`~rte.client.shm.ShmClient` of that
daemon, by name); one elsewhere goes through its host actor, and its chunks
arrive through Ray's object store (``path`` says which). When a host's node
dies, the router reports its sessions lost: :meth:`take` notes them, calls
naming them raise :class:`~rte.errors.EngineGone`, and ``attach`` admits them
again on a live daemon.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from rte.client import ShmClient
from rte.errors import EngineGone, RequestError

REMOTE_WAIT_S = 0.005  # how long a host's take waits for a first chunk


@dataclass(frozen=True)
class Frame:
    session: str
    chunk: int
    latent: np.ndarray[Any, Any]
    path: str  # "shm": this node's daemon, in place; "ray": another node's, by the object store


class RayClient:
    """A caller's sessions over the hosts a router places them on."""

    def __init__(self, router: Any, hosts: list[Any]) -> None:
        import ray  # noqa: PLC0415 (the optional extra)

        self._ray = ray
        self.router = router
        self.hosts = hosts
        self.owner = uuid.uuid4().hex
        self.node = ray.get_runtime_context().get_node_id()
        self.places = ray.get([h.where.remote() for h in hosts])  # (daemon, node) each
        self.home: dict[str, int] = {}
        self.lost: dict[str, str] = {}  # session -> why
        self._local: dict[int, ShmClient] = {}

    def path(self, session: str) -> str:
        return "shm" if self.places[self.home[session]][1] == self.node else "ray"

    def attach(self, session: str, conditioning: dict[str, Any] | None = None) -> None:
        index = self._ray.get(self.router.admit.remote(session, self.owner))
        try:
            if self.places[index][1] == self.node:
                self._shm(index).attach(session, conditioning or {})
            else:
                host = self.hosts[index]
                self._call(index, host.attach.remote(session, conditioning or {}, self.owner))
        except BaseException:
            self.router.release.remote(session)
            raise
        self.home[session] = index
        self.lost.pop(session, None)

    def act(self, session: str, conditioning: dict[str, Any]) -> None:
        index = self._index(session)
        if self.places[index][1] == self.node:
            self._shm(index).act(session, conditioning)
        else:
            self.hosts[index].act.remote(session, conditioning)  # as act: no answer awaited

    def detach(self, session: str) -> None:
        index = self._index(session)
        if self.places[index][1] == self.node:
            self._shm(index).detach(session)
        else:
            self._call(index, self.hosts[index].detach.remote(session))
        del self.home[session]
        self.router.release.remote(session)

    def take(self, timeout: float = 1.0) -> list[Frame]:
        """The chunks that came for this caller's sessions (waiting up to ``timeout``
        s on this node's daemons), local ones copied out and released."""
        self._note_lost()
        frames: list[Frame] = []
        remote = {i for s, i in self.home.items() if self.places[i][1] != self.node}
        pending = {i: self.hosts[i].take.remote(self.owner, REMOTE_WAIT_S) for i in remote}
        for index, client in list(self._local.items()):
            try:
                batch = client.poll_batch(timeout=timeout if not pending else REMOTE_WAIT_S)
                while batch is not None:
                    with batch:
                        for k, session in enumerate(batch.sessions):
                            latent = np.array(batch.latents[k])
                            frames.append(Frame(session, int(batch.chunks[k]), latent, "shm"))
                    batch = client.poll_batch(timeout=0)
            except EngineGone as exc:  # this node's daemon died: its sessions alone are lost
                del self._local[index]
                for session in [s for s, i in self.home.items() if i == index]:
                    del self.home[session]
                    self.lost[session] = f"EngineGone: {exc}"
        for ref in pending.values():
            try:
                got = self._ray.get(ref, timeout=timeout + 5)
            except Exception:  # its node is gone: the router will say which sessions
                continue
            frames += [Frame(s, c, latent, "ray") for s, c, latent in got if s in self.home]
        return frames

    def close(self) -> None:
        for session in list(self.home):
            try:
                self.detach(session)
            except Exception:  # a host gone meanwhile: nothing to detach there
                self.home.pop(session, None)
        for client in self._local.values():
            client.close()
        self._local.clear()

    # -- internals -------------------------------------------------------------

    def _shm(self, index: int) -> ShmClient:
        client = self._local.get(index)
        if client is None:
            client = self._local[index] = ShmClient(self.places[index][0], timeout=30)
        return client

    def _index(self, session: str) -> int:
        if session in self.lost:
            raise EngineGone(self.lost[session])
        index = self.home.get(session)
        if index is None:
            raise RequestError(f"session {session!r} is not attached through this client")
        return index

    def _call(self, index: int, ref: Any) -> Any:
        """Wait for a host's answer; its node gone is EngineGone, its refusal the error."""
        try:
            return self._ray.get(ref, timeout=30)
        except self._ray.exceptions.RayActorError as exc:
            raise EngineGone(f"the daemon {self.places[index][0]!r} is gone: {exc}") from None
        except self._ray.exceptions.RayTaskError as exc:
            cause: BaseException = exc.as_instanceof_cause()  # type: ignore[no-untyped-call]
            raise cause from None

    def _note_lost(self) -> None:
        for session in self._ray.get(self.router.lost.remote(self.owner)):
            index = self.home.pop(session, None)
            daemon = self.places[index][0] if index is not None else "?"
            self.lost[session] = f"EngineGone: the node of daemon {daemon!r} is gone"
