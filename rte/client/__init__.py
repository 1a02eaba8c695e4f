"""Clients of an engine: one interface, one core, three transports.

- :class:`EngineClient` — the interface: ``attach``, ``act``, ``reset``,
  ``detach``, ``poll``, ``results``, ``notices``, ``held``, ``close`` and ``with``.
- :class:`ShmClient` — over a daemon's shared memory (``rte serve``), from any
  local process: ``connect("mydaemon")``.
- :class:`InProcessClient` — over an engine in this process, served on a thread
  of its own: ``connect()`` (the reference model) or ``InProcessClient(engine)``.
- :class:`PoolClient` — over several daemons as one: ``connect_pool([...])``, or
  ``connect("NAME")`` when ``NAME-0``, ``NAME-1``... run.

Each is the one client core (:mod:`rte.client.core`) over its transport
(:mod:`rte.client.transport`); all hand out :class:`Chunk` s and raise only
:mod:`rte.errors` classes. :func:`connect_async` gives any of them as an
:class:`AsyncClient`, the same core and transport for asyncio code
(``await client.attach(...)``, ``async for``).
"""

from __future__ import annotations

import re

from rte.client.aio import AsyncClient, Connecting
from rte.client.base import Chunk, EngineClient
from rte.client.batch import ChunkBatch
from rte.client.inprocess import InProcessClient, InProcessTransport
from rte.client.migration import MigrationError
from rte.client.pool import PoolClient, PoolTransport, Recover
from rte.client.shm import ShmClient, ShmTransport
from rte.composed import ComposedEngine
from rte.contract import Notice, NoticeKind
from rte.errors import (
    AdmissionError,
    ClientClosedError,
    EngineGone,
    RequestError,
    RequestTimeout,
)
from rte.models import load_model
from rte.protocol.names import DaemonNames


def connect(
    name: str | None = None,
    timeout: float | None = None,
    *,
    policy: str = "spin-then-block",
    spin_us: float = 50.0,
    model: str = "reference",
    max_sessions: int = 8,
) -> EngineClient:
    """A client of the daemon ``name``, or of an engine in this process.

    Args:
        name: the daemon to attach to (``rte serve --name NAME``; ``NAME-0``,
            ``NAME-1``... as one pool when those run). None: an in-process engine
            over ``model`` with ``max_sessions`` rows, on a thread of its own.
        timeout: None (the default): the daemon must be running now; no daemon
            of that name, or a dead one, is EngineGone at once, saying how to
            start one. A number: wait up to that many seconds for it to come up
            (a daemon you have just launched).
        policy, spin_us: how a shm client waits for chunks (see :class:`ShmClient`).

    Raises:
        EngineGone: no live daemon of that name (in ``timeout``, when given).
        AdmissionError: the daemon serves its maximum of clients already.
    """
    if name is None:
        engine = ComposedEngine(load_model(model, max_sessions=max_sessions))
        return InProcessClient(engine)
    replicas = replicas_of(name)
    if replicas:
        return PoolClient(replicas, timeout=timeout)
    return ShmClient(name, timeout=timeout, policy=policy, spin_us=spin_us)


def replicas_of(name: str) -> list[str]:
    """``NAME-0``, ``NAME-1``... when there is no daemon ``NAME`` but those exist
    (``rte serve --name NAME --replicas N`` runs them)."""
    present = {n.daemon for n in DaemonNames.present()}
    return [] if name in present else members_of(name, present)


def members_of(name: str, present: set[str] | None = None) -> list[str]:
    """The daemons ``NAME-0``, ``NAME-1``... that have a control segment, in order."""
    if present is None:
        present = {n.daemon for n in DaemonNames.present()}
    found = [d for d in present if re.fullmatch(re.escape(name) + r"-\d+", d)]
    return sorted(found, key=lambda d: int(d.rpartition("-")[2]))


def connect_pool(
    names: list[str],
    timeout: float | None = None,
    *,
    reattach: bool = False,
    recover: Recover | None = None,
) -> PoolClient:
    """One client over the daemons ``names`` (see :class:`PoolClient`): sessions go
    to the one with most free rows and stay there; a dead daemon loses only its
    own sessions (``reattach=True``: attached again elsewhere; with ``recover``,
    e.g. :func:`rte.ipc.checkpoints.read_checkpoint`, from their last checkpoint).
    ``timeout`` as for :func:`connect`, for each daemon."""
    return PoolClient(names, timeout=timeout, reattach=reattach, recover=recover)


def connect_async(
    name: str | None = None,
    timeout: float | None = None,
    *,
    model: str = "reference",
    max_sessions: int = 8,
) -> Connecting:
    """:func:`connect` for asyncio code: ``client = await connect_async("d")``, or
    ``async with connect_async("d") as client:`` (closed on the way out).

    The client sleeps on the file descriptors its loop watches (each daemon rings
    its own only when the client sleeps): no thread per connection, no polling.
    ``NAME-0``, ``NAME-1``... are one pool, as for :func:`connect`. Raises what
    :func:`connect` raises, when awaited.
    """
    if name is None:
        return Connecting(
            lambda: InProcessTransport(ComposedEngine(load_model(model, max_sessions=max_sessions)))
        )
    daemon = name

    def transport() -> ShmTransport | PoolTransport:
        replicas = replicas_of(daemon)
        if replicas:
            return PoolTransport(replicas, timeout=timeout)
        return ShmTransport(daemon, timeout=timeout, wake="fd")

    return Connecting(transport)


__all__ = [
    "AdmissionError",
    "AsyncClient",
    "Chunk",
    "ChunkBatch",
    "ClientClosedError",
    "EngineClient",
    "EngineGone",
    "InProcessClient",
    "MigrationError",
    "Notice",
    "NoticeKind",
    "PoolClient",
    "RequestError",
    "RequestTimeout",
    "ShmClient",
    "connect",
    "connect_async",
    "connect_pool",
]
