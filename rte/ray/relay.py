"""Relay: a host's client of its daemon for one caller on another node, pushing.

A caller elsewhere cannot map this node's shared memory, so its
:class:`~rte.ray.hosting.DaemonHost` holds a client slot at the daemon for it
(a :class:`~rte.client.shm.ShmTransport` of its own, woken through its FIFO:
each caller's chunks are that slot's, no sorting between callers) and relays:

- **requests in**: the caller's requests, numbered by the caller's own client
  core, are sent as they are (an attach's ATTACHED answers the caller's seq); a
  request the daemon cannot take (no room in time, no input slot, no handle
  left) becomes an ERROR notice for that seq (REJECTED for an AdmissionError),
  so the caller's waiting call ends with the reason, as its own send would.
- **arrivals out**: :meth:`Relay.stream` is an async generator (a Ray streaming
  generator of the host's async actor method): it sleeps on the slot's FIFO on
  the actor's event loop and, when woken, yields everything that arrived as one
  list: notices as they are, each step's batch as a :class:`Step` (its chunks
  copied once, into the object store's message). One message per wake-up, not a
  call per chunk, and none while nothing arrives.
- **releases back**: the step's slab slots stay held until the caller releases
  the rows (:meth:`Relay.give_back`, the caller's releases gathered into one
  call), so credits hold end to end: a caller that stops reading stalls its own
  sessions, and neither this actor nor the object store grows.

Everything runs on the actor's one event loop thread: the slot is never used
from two threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from rte.client.batch import ChunkBatch
from rte.client.shm import ShmTransport
from rte.contract import Manifest, Notice, NoticeKind
from rte.errors import AdmissionError, EngineGone, RequestTimeout, RteError
from rte.protocol.requests import Request

CHECK_EVERY_S = 0.25  # a sleeping relay checks its daemon's liveness this often
RETRY_S = 0.0005  # no room in the daemon's inbox: try again after this


@dataclass(frozen=True)
class Step:
    """One step's chunks for one caller, as they travel: the columns of its
    :class:`~rte.client.batch.ChunkBatch`, the latents copied into one array.
    ``ident`` names the host's held batch its release gives back."""

    ident: int
    sessions: list[str]
    chunks: np.ndarray[Any, Any]
    latents: np.ndarray[Any, Any]
    generated_ns: np.ndarray[Any, Any]
    applied: np.ndarray[Any, Any]
    emitted_ns: int
    pushed_ns: int


@dataclass(frozen=True)
class Ended:
    """The last message of a stream: the daemon is gone (``why``), or the caller left."""

    why: str


Message = list[Step | Notice | Ended]


class Relay:
    """Daemon ``name``'s client for one caller elsewhere; see the module."""

    def __init__(self, name: str, timeout: float = 30.0) -> None:
        self.transport = ShmTransport(name, timeout=timeout, wake="fd")
        self.manifest: Manifest = self.transport.manifest
        self.held: dict[int, list[Any]] = {}  # ident -> [batch, rows not yet given back]
        self._next = 0
        self._early: list[Notice] = []  # refusals of requests, to go out first
        self._woke: asyncio.Future[None] | None = None  # what the stream sleeps on
        self._streaming = False
        self.closed = False
        self.counts = {"messages": 0, "steps": 0, "give_backs": 0}  # what it relayed so far

    # -- requests in ------------------------------------------------------------

    async def send(self, request: Request, room_s: float) -> None:
        """Lend and send ``request`` (its first try before any await: the order of
        the caller's calls is the order sent); what cannot be sent goes back as an
        ERROR notice for its seq."""
        if self.closed:
            return
        transport = self.transport
        deadline = time.monotonic() + room_s
        try:
            lent = transport.lend(request, 0.0)
            try:
                while True:
                    try:
                        transport.send(lent, 0.0)
                        return
                    except RequestTimeout:
                        if time.monotonic() >= deadline:
                            raise
                    await asyncio.sleep(RETRY_S)
            except BaseException:
                transport.unlend(lent)
                raise
        except RteError as exc:  # as the caller's own call would have raised it
            kind = NoticeKind.REJECTED if isinstance(exc, AdmissionError) else NoticeKind.ERROR
            why = str(exc) if kind is NoticeKind.REJECTED else f"{type(exc).__name__}: {exc}"
            self._early.append(Notice(request.session, kind, why, request.seq))
            self._poke()

    def give_back(self, releases: list[tuple[int, np.ndarray[Any, Any]]]) -> None:
        """The caller released these rows (by batch): their slots go back."""
        self.counts["give_backs"] += 1
        for ident, rows in releases:
            held = self.held.get(ident)
            if held is None or self.transport.closed:
                continue
            batch, left = held
            self.transport.give_back(batch, rows)
            held[1] = left - len(rows)
            if held[1] <= 0:
                del self.held[ident]

    # -- arrivals out -----------------------------------------------------------

    async def stream(self) -> AsyncIterator[Message]:
        """Every arrival, a list per wake-up, until the caller leaves or the daemon
        dies (then one last :class:`Ended`)."""
        loop = asyncio.get_running_loop()
        transport = self.transport
        fd = transport.wake_fds()[0]
        self._streaming = True
        try:
            while not self.closed:
                message = self._take()
                if message:
                    self.counts["messages"] += 1
                    yield message
                    continue
                if transport.arm():
                    continue
                self._woke = woke = loop.create_future()
                loop.add_reader(fd, _resolve, woke)
                try:
                    await asyncio.wait([woke], timeout=CHECK_EVERY_S)
                finally:
                    loop.remove_reader(fd)
                    self._woke = None
                    alive = transport.disarm()
                transport.check_live(alive)
        except EngineGone as exc:
            yield [*self._early, Ended(f"EngineGone: {exc}")]
            return
        finally:
            self._streaming = False
            if self.closed:
                self._leave()
        yield [Ended("the caller left")]

    def _take(self) -> Message:
        message: Message = list(self._early)
        self._early = []
        for item in self.transport.receive(_held_here):
            if isinstance(item, ChunkBatch):
                message.append(self._step(item))
            elif isinstance(item, Notice):
                message.append(item)
        return message

    def _step(self, batch: ChunkBatch) -> Step:
        ident, self._next = self._next, self._next + 1
        self.counts["steps"] += 1
        self.held[ident] = [batch, len(batch)]
        latents = batch.latents
        copied = np.array(latents) if batch.contiguous else np.stack(list(latents))
        return Step(
            ident,
            list(batch.sessions),
            np.array(batch.chunks),
            copied,
            np.array(batch.generated_ns),
            np.array(batch.applied),
            batch.emitted_ns,
            batch.pushed_ns,
        )

    def _poke(self) -> None:
        if self._woke is not None:
            _resolve(self._woke)

    # -- leaving ----------------------------------------------------------------

    def close(self) -> None:
        """Leave the daemon (it detaches this caller's sessions, takes its slots back)."""
        if not self.closed:
            self.closed = True
            if self._streaming:
                self._poke()  # the stream leaves when it wakes: it sleeps on the slot's FIFO
            else:
                self._leave()

    def _leave(self) -> None:
        self.held.clear()
        with contextlib.suppress(Exception):
            self.transport.close()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _held_here(batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
    """A relayed batch is given back by :meth:`Relay.give_back`, never by itself."""
