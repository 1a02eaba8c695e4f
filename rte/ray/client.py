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

:meth:`RayClient.take` is the older convenience: every chunk that came, copied
out and released, as :class:`Frame` s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rte.client.base import EngineClient
from rte.ray.remote import RemoteLease
from rte.ray.transport import RayTransport


@dataclass(frozen=True)
class Frame:
    session: str
    chunk: int
    latent: np.ndarray[Any, Any]
    path: str  # "shm": this node's daemon, in place; "ray": another node's, pushed by its host


class RayClient(EngineClient):
    """A caller's sessions over the hosts a router places them on.

    Attributes (its transport's): ``owner`` (this caller's id at the router and
    the hosts), ``places`` ((daemon, node) of each host), ``home`` (session ->
    its host's index), ``lost`` (session -> why its host is gone).
    """

    transport: RayTransport

    def __init__(self, router: Any, hosts: list[Any]) -> None:
        super().__init__(RayTransport(router, hosts))
        ray = self.transport
        self.router, self.hosts, self.owner = router, hosts, ray.owner
        self.places, self.home, self.lost = ray.places, ray.home, ray.lost

    def path(self, session: str) -> str:
        """``"shm"`` when the session's daemon is on this node, else ``"ray"``."""
        return self.transport.path(session)

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
