"""InProcessClient: the EngineClient interface over an engine in this process.

:class:`InProcessTransport` drives the engine by :func:`rte.serve.default_serve`
on a thread of its own (which steps it for its whole life, as CUDA streams
want), through two
``queue.Queue`` s: requests in, and out one item per step (its chunks, as one
batch) or notice. No copy is made: a batch's latents are the block the engine
wrote the step's chunks into (made read-only).

Backpressure, as in the daemon: each session may have at most its ``credits``
chunks emitted and not released (default :data:`rte.protocol.requests.DEFAULT_CREDITS`),
and the client at most ``quota`` in all; a session past either is not due, so
a caller that stops reading stalls its sessions instead of growing memory.
Releasing wakes the loop only when it waits for this client. Requests are held
to the wire's limits (session id length, sendable values), so both client
forms refuse the same requests, and at most ``INBOX_LIMIT`` wait for the loop.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rte.client.base import EngineClient
from rte.client.batch import ChunkBatch, Release
from rte.client.inputs import InputLoan, by_reference, loan_layout
from rte.client.transport import Arrival, Transport
from rte.contract import Engine, Notice, NoticeKind, StepResult
from rte.credits import chunks_to_drive, credit_refusal
from rte.errors import EngineGone, RequestError, RequestTimeout
from rte.protocol.requests import DEFAULT_CREDITS, Attach, Export, Request, Stop, Wake
from rte.protocol.wire import encode_request
from rte.realtime import ADMISSIONS
from rte.serve import default_serve

STOP_TIMEOUT_S = 30.0
INBOX_LIMIT = 4096  # requests waiting for the loop: past it, a call times out
LIVENESS_EVERY_S = 0.1


class _Ledger:
    """Credit and quota, counted on both sides: the loop thread counts what goes
    out (and asks who is due), the client what comes back. One lock for both."""

    def __init__(self, quota: int, credits: int) -> None:
        self.quota, self.credits = quota, credits
        self.lock = threading.Lock()
        self._unreleased = 0  # chunks put in the outbox and not yet released
        self._credit: dict[str, int] = {}  # per session, as attached
        self._emitted: dict[str, int] = {}  # per session binding, since its ATTACHED
        self._consumed: dict[str, int] = {}
        self._epoch: dict[str, int] = {}  # bindings of each session id so far
        self._bound: set[str] = set()  # ATTACHED and not DETACHED since
        self._starved = False  # the loop left a session out for want of credit

    def due(self, sessions: list[str]) -> list[str]:
        """On the loop thread: the sessions with credit, while the quota holds."""
        with self.lock:
            if self._unreleased >= self.quota:
                due = []
            else:
                emitted, consumed, credit = self._emitted, self._consumed, self._credit
                due = [
                    s
                    for s in sessions
                    if emitted.get(s, 0) - consumed.get(s, 0) < credit.get(s, self.credits)
                ]
            self._starved = len(due) < len(sessions)
        return due

    def admit(self, request: Attach) -> None:
        """An attach's credits, held against the quota (RequestError past it)."""
        with self.lock:  # attached already: the binding stays as it is
            if request.session not in self._bound:
                asked = request.credits or self.credits
                held = sum(self._credit.get(s, 0) for s in self._bound)
                refusal = credit_refusal(held, asked, self.quota, "pass a larger quota=")
                if refusal is not None:
                    raise RequestError(refusal)
                self._credit[request.session] = asked

    def sent(self, items: list[StepResult | Notice]) -> list[_Step | Notice]:
        """On the loop thread: count what goes out, in order, and group each run
        of chunks (a step's) into one item, stamped with its sessions' bindings."""
        out: list[_Step | Notice] = []
        with self.lock:
            emitted, epoch = self._emitted, self._epoch
            for item in items:
                if isinstance(item, StepResult):
                    if not out or not isinstance(out[-1], _Step):
                        out.append(_Step([], []))
                    step = out[-1]
                    assert isinstance(step, _Step)
                    step.results.append(item)
                    step.epochs.append(epoch.get(item.session, 0))
                    emitted[item.session] = emitted.get(item.session, 0) + 1
                    self._unreleased += 1
                    continue
                s = item.session
                if item.kind is NoticeKind.ATTACHED and s not in self._bound:
                    self._bound.add(s)  # a new binding counts from zero
                    epoch[s] = epoch.get(s, 0) + 1
                    emitted[s] = self._consumed[s] = 0
                elif item.kind is NoticeKind.DETACHED:
                    self._bound.discard(s)
                out.append(item)
        return out

    def released(self, lease: list[tuple[str, int]], rows: np.ndarray[Any, Any]) -> bool:
        """Rows of a step came back; True when the loop waits for them (wake it)."""
        with self.lock:
            self._unreleased -= len(rows)
            for row in rows.tolist():
                session, epoch = lease[row]
                if self._epoch.get(session) == epoch:
                    self._consumed[session] = self._consumed.get(session, 0) + 1
            wake, self._starved = self._starved, False
        return wake


class InProcessTransport(Transport):
    """Serve ``engine`` on a thread of this process; args as :class:`InProcessClient`."""

    def __init__(
        self,
        engine: Engine,
        *,
        quota: int | None = None,
        credits: int = DEFAULT_CREDITS,
        pace_hz: float | None = None,
        admission: str = "realtime",
    ) -> None:
        self.name, self.manifest = "in-process", engine.manifest()
        self.engine = engine
        quota = quota or chunks_to_drive(self.manifest.max_sessions, credits)
        if quota < 1 or credits < 1:
            raise ValueError(f"quota and credits must be at least 1, got {quota}, {credits}")
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {', '.join(ADMISSIONS)}, not {admission!r}")
        self.ledger = _Ledger(quota, credits)
        self._inbox: queue.Queue[Request | Stop | Wake] = queue.Queue(INBOX_LIMIT)
        self._outbox = _Outbox(self.ledger.sent, self._rouse)  # the loop's side
        self._early: list[_Step | Notice] = []  # what a wait took out of the outbox
        self._sleeping = False  # an event loop waits on _wakes for the outbox
        self._wakes = -1  # an eventfd, made when an event loop first waits (rte.client.aio)
        self.thread = threading.Thread(
            target=self._serve, args=(pace_hz, admission), name="rte-inprocess", daemon=True
        )
        self.failure: BaseException | None = None
        self.thread.start()

    def _serve(self, pace_hz: float | None, admission: str) -> None:
        try:
            default_serve(
                self.engine,
                self._inbox,
                self._outbox,
                pace_hz=pace_hz,
                due=self.ledger.due,
                admission=admission,
            )
        except BaseException as exc:  # the client must say why its engine is gone
            self.failure = exc
        finally:
            self._rouse(force=True)  # an event loop waiting on us learns at once

    # -- requests out -----------------------------------------------------------

    def send(self, request: Request, room_s: float = 0.0) -> None:
        self._check_alive()
        if not isinstance(request, Export):  # (its state goes into a box, not a slot)
            encode_request(by_reference(request))  # the wire's limits hold here too, no copy
        if isinstance(request, Attach):
            self.ledger.admit(request)
        try:
            self._inbox.put(request, timeout=room_s)
        except queue.Full:
            raise RequestTimeout(
                f"the engine is not taking requests: {INBOX_LIMIT} wait already ({room_s}s)"
            ) from None

    def loan(self, shape: tuple[int, ...], dtype: Any, timeout: float) -> InputLoan:
        shape, dtype, _ = loan_layout(shape, dtype)  # RequestError for one no form can lend
        return InputLoan(np.empty(shape, dtype), None)

    # -- arrivals in ------------------------------------------------------------

    def receive(self, release: Release) -> list[Arrival]:
        items, self._early = self._early, []
        try:
            while True:
                items.append(self._outbox.queue.get_nowait())
        except queue.Empty:
            pass
        if not items:
            return []
        taken = time.monotonic_ns()
        return [self._batch(i, taken, release) if isinstance(i, _Step) else i for i in items]

    def wait(self, timeout: float) -> bool:
        if self._early:
            return True
        deadline = time.monotonic() + timeout
        while True:
            try:  # in slices, so that a loop that ended is noticed within one
                wait = min(deadline - time.monotonic(), LIVENESS_EVERY_S)
                if wait > 0:
                    self._early.append(self._outbox.queue.get(timeout=wait))
                else:
                    self._early.append(self._outbox.queue.get_nowait())
                return True
            except queue.Empty:
                self._check_alive()
                if time.monotonic() >= deadline:
                    return False

    def _batch(self, step: _Step, taken: int, release: Release) -> ChunkBatch:
        results = step.results
        latents = [r.latent for r in results]
        block = _one_block(latents)  # type: ignore[arg-type]  # chunks carry latents
        for latent in latents if block is None else [block]:
            latent.flags.writeable = False  # type: ignore[union-attr]
        first = results[0].timing
        lease = list(zip([r.session for r in results], step.epochs, strict=True))
        return ChunkBatch(
            [r.session for r in results],
            np.array([r.chunk for r in results], np.int64),
            block if block is not None else latents,  # type: ignore[arg-type]
            np.array([r.timing.generated_ns for r in results], np.int64),
            emitted_ns=first.emitted_ns,
            pushed_ns=first.pushed_ns or first.emitted_ns,
            taken_ns=taken,
            release=release,
            lease=lease,
            applied=[r.applied for r in results],
        )

    def give_back(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        if self.ledger.released(batch.lease, rows):
            with contextlib.suppress(queue.Full):  # a full inbox wakes the loop anyway
                self._inbox.put_nowait(Wake())

    # -- waiting on an event loop -------------------------------------------

    def wake_fds(self) -> list[int]:
        with self.ledger.lock:
            if self._wakes < 0:
                self._wakes = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            return [self._wakes]

    def arm(self) -> bool:
        with self.ledger.lock:  # the loop thread puts, then reads the flag under this lock
            if self._early or not self._outbox.queue.empty() or not self.thread.is_alive():
                return True
            self._sleeping = True
            return False

    def disarm(self) -> bool:
        with self.ledger.lock:
            self._sleeping = False
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._wakes)
        return True

    def check_live(self, alive: bool = True) -> None:
        self._check_alive()

    def _rouse(self, *, force: bool = False) -> None:
        """On the loop thread, after a put: wake an event loop that sleeps on us."""
        with self.ledger.lock:
            wake, self._sleeping = self._sleeping or force, False
            if wake and self._wakes >= 0:  # (none made yet: nobody to wake)
                os.eventfd_write(self._wakes, 1)

    def _check_alive(self) -> None:
        if not self.thread.is_alive():
            reason = f": {self.failure!r}" if self.failure is not None else ""
            raise EngineGone(f"the in-process serve loop has ended{reason}")

    # -- leaving --------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(queue.Full):
            self._inbox.put(Stop(), timeout=STOP_TIMEOUT_S)
        self.thread.join(STOP_TIMEOUT_S)
        close = getattr(self.engine, "close", None)
        if close is not None and not self.thread.is_alive():
            close()
        with self.ledger.lock:
            if self._wakes >= 0:
                os.close(self._wakes)
                self._wakes = -1


class InProcessClient(EngineClient):
    """Serve ``engine`` on a thread of this process; the client owns the engine.

    Args:
        engine: any Level-1 engine (e.g. ``ComposedEngine(ReferenceModel(8))``).
        quota: chunks received and not yet released before every session stalls
            (default: what every row at ``credits`` needs, so none is throttled; an
            attach whose credits the quota cannot hold is refused).
        credits: each session's default credits (see :meth:`EngineClient.attach`).
        pace_hz: target steps per second; None steps as fast as possible.
        admission: ``realtime`` (paced: an attach past the sessions the pace holds,
            as measured, is refused) or ``rows`` (see :class:`rte.serve.ServeLoop`).
    """

    transport: InProcessTransport

    def __init__(
        self,
        engine: Engine,
        *,
        quota: int | None = None,
        credits: int = DEFAULT_CREDITS,
        pace_hz: float | None = None,
        admission: str = "realtime",
    ) -> None:
        super().__init__(
            InProcessTransport(
                engine, quota=quota, credits=credits, pace_hz=pace_hz, admission=admission
            )
        )
        self.engine = engine
        self.quota = self.transport.ledger.quota
        self.credits = credits


@dataclass
class _Step:
    """One step's chunks, as queued: each with its session's binding then."""

    results: list[StepResult]
    epochs: list[int]


def _one_block(latents: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any] | None:
    """The block the latents are the rows of, in order, if they are all of one."""
    base = latents[0].base
    if (
        not isinstance(base, np.ndarray)
        or len(base) != len(latents)
        or base.shape[1:] != latents[0].shape
        or any(latent.base is not base for latent in latents)
        or any(
            latent.__array_interface__["data"][0] != base[i].__array_interface__["data"][0]
            for i, latent in enumerate(latents)
        )
    ):
        return None
    return base


class _Outbox:
    """The loop's outbox, owned by its transport: a step's chunks go out as one
    item, after the notices that came before them, counted against credit and
    quota (``sent``); then ``rouse`` wakes an event loop that sleeps on them."""

    def __init__(
        self,
        sent: Callable[[list[StepResult | Notice]], list[_Step | Notice]],
        rouse: Callable[[], None],
    ) -> None:
        self.queue: queue.Queue[_Step | Notice] = queue.Queue()  # read by the transport
        self._sent = sent
        self._rouse = rouse

    def put(self, item: Any) -> None:
        self.put_many([item])

    def put_many(self, items: list[StepResult | Notice]) -> None:
        for item in self._sent(items):
            self.queue.put(item)
        self._rouse()
