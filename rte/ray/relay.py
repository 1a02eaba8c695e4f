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
- **releases back**: a step's chunks are copied into the message, so a
  session's rows go back to the daemon as it is sent while the session has room
  in its window (:mod:`rte.ray.window`: ``window`` chunks ahead of its caller,
  beyond its credits; its chunks flow while the caller's releases are a round
  trip away); past that they stay held until the caller releases them
  (:meth:`Relay.give_back`, the caller's releases gathered into one call). So
  credits hold end to end: a caller that stops reading stalls its own sessions
  after ``credits + window`` chunks, and neither this actor nor the object
  store grows.
- **states through the object store**: an export is sent with a slot of this
  slot's input segment for the daemon to write the state into; when its
  EXPORTED comes, the state's bytes are put in Ray's object store here and an
  :class:`Exported` (the ObjectRef, not the bytes) goes out just before the
  notice. An attach that moves a session in carries a :class:`StoredState` (the
  caller's ObjectRef) in place of the bytes: this host fetches them from the
  object store, then lends them to its daemon's input slab as any large input.

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
from rte.errors import AdmissionError, EngineGone, RequestTimeout, RteError, StateError
from rte.protocol.inputs import with_conditioning
from rte.protocol.requests import STATE_KEY, Attach, Export, Request
from rte.ray.window import WINDOW, Window

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


@dataclass(frozen=True)
class Exported:
    """The state an export (``seq``) handed over: its bytes (uint8) in Ray's object
    store at ``ref``; the EXPORTED notice follows in the same message."""

    seq: int
    ref: Any


@dataclass(frozen=True)
class StoredState:
    """An attach's state by reference (in its conditioning, under the state key):
    its bytes (uint8) in Ray's object store at ``ref``, fetched by the host."""

    ref: Any


Message = list[Step | Exported | Notice | Ended]


class Relay:
    """Daemon ``name``'s client for one caller elsewhere; see the module."""

    def __init__(self, name: str, timeout: float = 30.0, window: int = WINDOW) -> None:
        self.transport = ShmTransport(name, timeout=timeout, wake="fd")
        self.manifest: Manifest = self.transport.manifest
        self.window = Window(self._to_daemon, window)  # the rows sent, which went back early
        self._next = 0
        self._early: list[Notice] = []  # refusals of requests, to go out first
        self._exports: dict[int, Export] = {}  # seq -> an export sent with its slot
        self._woke: asyncio.Future[None] | None = None  # what the stream sleeps on
        self._streaming = False
        self._order = asyncio.Lock()  # requests go to the daemon in the order they came
        self.closed = False
        # what it relayed so far (states: through the object store, each way)
        self.counts = dict.fromkeys(
            ("messages", "steps", "give_backs", "states_out", "states_in"), 0
        )

    # -- requests in ------------------------------------------------------------

    async def send(self, request: Request, room_s: float) -> None:
        """Lend and send ``request`` (its first try before any await: the order of
        the caller's calls is the order sent; one that waits for room, up to
        ``room_s``, holds up those after it; only an attach moving a state in
        awaits its bytes first, and the caller waits for its answer); what cannot
        be sent goes back as an ERROR notice for its seq."""
        if self.closed:
            return
        deadline = time.monotonic() + room_s
        try:
            if isinstance(request, Attach) and isinstance(
                request.conditioning.get(STATE_KEY), StoredState
            ):
                request = await self._fetched(request)
            async with self._order:  # (FIFO, and taken at once when nothing waits)
                await self._sent(request, deadline)
        except RteError as exc:  # as the caller's own call would have raised it
            kind = NoticeKind.REJECTED if isinstance(exc, AdmissionError) else NoticeKind.ERROR
            why = str(exc) if kind is NoticeKind.REJECTED else f"{type(exc).__name__}: {exc}"
            self._early.append(Notice(request.session, kind, why, request.seq))
            self._poke()

    async def _sent(self, request: Request, deadline: float) -> None:
        """Lent, then pushed into the daemon's inbox, each tried again until
        ``deadline`` while there is no room; what was lent goes back on a failure."""
        transport = self.transport
        lent = await self._lent(request, deadline)
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
            self._export_done(request.seq)
            raise

    async def _lent(self, request: Request, deadline: float) -> Request:
        """``request`` lent (its large arrays copied into input slots, an export's
        slot taken), waiting until ``deadline`` for slots the daemon still holds
        (the frames an act replaces are read until a step later), as the caller's
        own ``act`` waits on this node."""
        transport = self.transport
        while True:
            try:
                if isinstance(request, Export):
                    lent = self._exports[request.seq] = transport.export_into(request, 0.0)
                    return lent
                return transport.lend(request, 0.0)
            except RequestTimeout:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(RETRY_S)

    async def _fetched(self, request: Attach) -> Attach:
        """``request`` with its state's bytes, fetched from the object store;
        StateError (the caller's attach answered with it) when they are lost."""
        stored: StoredState = request.conditioning[STATE_KEY]
        try:
            data = await stored.ref
        except Exception as exc:  # (Ray's: the owner died, the object lost, ...)
            raise StateError(
                f"the state of {request.session!r} moving in could not be fetched from "
                f"Ray's object store ({type(exc).__name__}): the caller that put it, or its "
                "node, is gone; attach it again with its state"
            ) from None
        self.counts["states_in"] += 1
        return with_conditioning(request, {**request.conditioning, STATE_KEY: data})

    def give_back(self, releases: list[tuple[int, np.ndarray[Any, Any]]]) -> None:
        """The caller released these rows (by batch): those still held go back, and
        each session's window moves on (:mod:`rte.ray.window`)."""
        self.counts["give_backs"] += 1
        for ident, rows in releases:
            self.window.released(ident, rows)

    def _to_daemon(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        if not self.transport.closed:
            self.transport.give_back(batch, rows)

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
                if item.seq in self._exports:
                    message += self._handed_over(item)
                else:
                    message.append(item)
        return message

    def _handed_over(self, notice: Notice) -> list[Exported | Notice]:
        """An export's answer: on EXPORTED, its state's bytes put in the object store."""
        import ray  # noqa: PLC0415 (an actor: Ray is there)

        if notice.kind is not NoticeKind.EXPORTED:  # (its DETACHED, or a refusal)
            if notice.kind is not NoticeKind.DETACHED:
                self._export_done(notice.seq)
            return [notice]
        try:
            state = self.transport.exported(self._exports[notice.seq], int(notice.message))
        except RteError as exc:  # (torn bytes: said to the caller's waiting export)
            why = f"{type(exc).__name__}: {exc}"
            return [Notice(notice.session, NoticeKind.ERROR, why, notice.seq)]
        finally:
            self._export_done(notice.seq)
        ref = ray.put(np.frombuffer(state.to_bytes(), np.uint8))
        self.counts["states_out"] += 1
        return [Exported(notice.seq, ref), notice]

    def _export_done(self, seq: int) -> None:
        lent = self._exports.pop(seq, None)
        if lent is not None and not self.transport.closed:
            self.transport.export_done(lent)

    def _step(self, batch: ChunkBatch) -> Step:
        ident, self._next = self._next, self._next + 1
        self.counts["steps"] += 1
        latents = batch.latents
        copied = np.array(latents) if batch.contiguous else np.stack(list(latents))
        step = Step(
            ident,
            list(batch.sessions),
            np.array(batch.chunks),
            copied,
            np.array(batch.generated_ns),
            np.array(batch.applied),
            batch.emitted_ns,
            batch.pushed_ns,
        )
        self.window.sent_step(ident, batch)  # (copied: rows with room go back now)
        return step

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
        self.window.clear()
        with contextlib.suppress(Exception):
            self.transport.close()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _held_here(batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
    """A relayed batch is given back by :meth:`Relay.give_back`, never by itself."""
