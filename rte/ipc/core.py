"""The daemon's core loop: one engine served to many clients over their rings.

It runs on the daemon's worker thread for the engine's whole life (CUDA
streams are per-thread); :mod:`rte.ipc.process` creates what it runs on and
stops it. Each turn is a short numbered sequence:

1. beat the heartbeat; adopt new clients and reap dead ones (their sessions
   are detached, their slots and rings given back; nobody else notices);
2. drain every client's inbox: each record is decoded, checked by the
   :class:`~rte.ipc.router.Router` (ownership) and handed to the shared
   :class:`~rte.serve.ServeLoop`; a bad record gets an ERROR back to its
   sender only, and nothing one client sends can end the loop;
3. step the due sessions (owners with slab quota left); the engine writes
   each chunk straight into a slab slot (:class:`~rte.ipc.allocator.SlabAllocator`),
   which is published and announced to its owner in one fixed record;
4. detach the sessions of a client that consumed nothing for the idle limit,
   and tell it why;
5. wait: on the doorbell when idle (by the wait policy), or for the next tick
   when paced.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterable

from rte.composed import ComposedEngine
from rte.contract import Notice, NoticeKind, StepResult
from rte.errors import WireError
from rte.ipc.allocator import SlabAllocator
from rte.ipc.clients import ClientTable, Connection
from rte.ipc.control import Control, Counter, DaemonState
from rte.ipc.router import Router
from rte.ipc.settings import Settings
from rte.ipc.wire import Bye, ChunkEncoder, decode_request, encode_notice, request_seq
from rte.serve import Detach, OutboxItem, Reset, ServeLoop
from rte.stages import StageModel
from shm import Doorbell, RingCorrupt, Segment, Slab, WaitPolicy, wait_any

log = logging.getLogger("rte.daemon")
SCAN_EVERY_S = 0.1
SPIN_NS = 50_000  # spin-then-block: how long an idle daemon polls before it sleeps
SPIN_SLICE_NS = 1_000_000  # spin: how long it polls between yields
IDLE_SLEEP_S = 0.05  # the longest sleep: the loop must come round to beat and scan
_COUNTED = {
    NoticeKind.ERROR: Counter.ERRORS,
    NoticeKind.DROPPED: Counter.CHUNKS_DROPPED,
    NoticeKind.REJECTED: Counter.ADMISSION_REJECTIONS,
}


@dataclasses.dataclass(frozen=True)
class Shared:
    """The shared objects a daemon serves on (made by :mod:`rte.ipc.process`)."""

    segment: Segment
    control: Control
    slab: Slab
    bell: Doorbell
    client_bells: list[Doorbell]


class DaemonCore:
    """The serve loop of a daemon: build it, then :meth:`run` on the worker thread."""

    def __init__(self, settings: Settings, shared: Shared, model: StageModel) -> None:
        self.settings = settings
        self.control = shared.control
        self.slab = shared.slab
        self.bell = shared.bell
        self.table = ClientTable(
            shared.control, shared.segment, shared.slab, shared.bell, shared.client_bells
        )
        self.router = Router()
        manifest = model.manifest()
        self.allocator = SlabAllocator(shared.slab, manifest, self.router.owner_index)
        self.engine = ComposedEngine(model, allocator=self.allocator)
        self.loop = ServeLoop(self.engine)
        self.encode_chunk = ChunkEncoder(manifest.latent_dtype, manifest.latent_shape)
        self.policy = WaitPolicy(settings.wait_policy)
        self.failure: BaseException | None = None
        self._emitted = 0
        self._next_scan = 0.0
        self._claims = -1

    def run(self, stopping: threading.Event) -> None:
        """Serve until ``stopping`` is set; then finalize every session. A failure
        of the loop itself is kept in :attr:`failure` (the process reports it)."""
        period = 1.0 / self.settings.pace_hz if self.settings.pace_hz else 0.0
        next_tick = time.monotonic()
        try:
            while not stopping.is_set():
                stepped = self.turn()
                if period:  # 5.
                    next_tick += period
                    delay = next_tick - time.monotonic()
                    if delay > 0:
                        stopping.wait(delay)
                    else:
                        next_tick = time.monotonic()
                elif not stepped:
                    self._idle_wait()
        except BaseException as exc:  # the daemon must say why it died
            log.exception("the serve loop failed")
            self.failure = exc
        finally:
            self.finish()

    def turn(self) -> bool:
        """One turn of the loop; True when some session stepped."""
        self.control.beat()  # 1.
        now = time.monotonic()
        claims = self.control.claims
        if now >= self._next_scan or claims != self._claims:
            self._claims, self._next_scan = claims, now + SCAN_EVERY_S
            for dead in self.table.scan():
                self._reap(dead)
                self.control.count(Counter.DEAD_CLIENTS_REAPED)
        for connection in list(self.table.connections.values()):  # 2.
            connection.flush()
            self._drain(connection)
        due = self.table.due()  # 3.
        if due:
            self._deliver(self.loop.step(due), None)
            self.control.count(Counter.STEPS)
        if self._emitted:
            self.control.count(Counter.CHUNKS, self._emitted)
            self._emitted = 0
        limit = self.settings.idle_limit_s  # 4.
        for idle in self.table.idle(now, limit):
            reason = f"idle: nothing consumed for {limit:g}s (the idle limit)"
            for session in list(idle.sessions):
                self._detach(session, reason=reason, finalize=False)
                self.control.count(Counter.IDLE_DETACHES)
            self.table.publish_sessions(idle)
        return bool(due)

    def finish(self) -> None:
        """Finalize every session (in-flight chunks go out where they fit), close the engine."""
        self.control.set_state(DaemonState.STOPPING)
        for session in list(self.router.owners):
            self._detach(session)
        for connection in self.table.connections.values():
            connection.flush()
        self.engine.close()

    # -- 2. requests --------------------------------------------------------

    def _drain(self, connection: Connection) -> None:
        try:
            records = connection.inbox.pop_batch_nowait()
        except RingCorrupt:
            connection.inbox.reset()
            self._send(connection, Notice("", NoticeKind.ERROR, "RingCorrupt: inbox was reset"))
            return
        for raw in records:
            self.control.count(Counter.REQUESTS)
            self._request(connection, raw)
            if connection.index not in self.table.connections:
                return  # it said BYE

    def _request(self, connection: Connection, raw: bytes) -> None:
        try:
            message = decode_request(raw)
        except WireError as exc:
            refusal = Notice("", NoticeKind.ERROR, f"WireError: {exc}", request_seq(raw))
            self._deliver([refusal], connection)
            return
        if isinstance(message, Bye):
            self._reap(connection)
            return
        refusal_text = self.router.refuse(connection, message)
        if refusal_text is not None:
            refusal = Notice(message.session, NoticeKind.ERROR, refusal_text, message.seq)
            self._send(connection, refusal)
            self.control.count(Counter.ERRORS)
            return
        if isinstance(message, Detach | Reset) and not self._room_to_finalize(message.session):
            message = dataclasses.replace(message, finalize=False)
        self._deliver(self.loop.handle(message), connection)
        self.table.publish_sessions(connection)

    def _room_to_finalize(self, session: str) -> bool:
        """Whether a detaching session's in-flight chunk has a slot to go to. If
        not, its owner is told the chunk is dropped: a slot shortage never fails
        a step for everyone."""
        owner = self.router.owner(session)
        if owner is None or self.table.room(owner) > 0:
            return True
        dropped = Notice(
            session, NoticeKind.DROPPED, "in-flight chunk dropped at detach: no free slot"
        )
        self._deliver([dropped], None)
        return False

    def _detach(self, session: str, *, reason: str = "", finalize: bool = True) -> None:
        finalize = finalize and self._room_to_finalize(session)
        try:
            items = self.loop.detach(session, finalize=finalize, reason=reason)
        except Exception as exc:
            items = [Notice(session, NoticeKind.ERROR, f"detach failed: {exc}")]
        self._deliver(items, None)

    def _reap(self, connection: Connection) -> None:
        """Detach a gone (or leaving) client's sessions, give back all it held."""
        for session in list(connection.sessions):
            self._detach(session, finalize=False)  # nobody is left to read its last chunk
        self.table.remove(connection)

    # -- 3. delivering ------------------------------------------------------

    def _deliver(self, items: Iterable[OutboxItem], requester: Connection | None) -> None:
        for item in items:
            if isinstance(item, StepResult):
                self._deliver_chunk(item)
                continue
            counter = _COUNTED.get(item.kind)
            if counter is not None:
                self.control.count(counter)
            everyone = self.table.connections.values()
            for connection in self.router.route(item, requester, everyone):
                self._send(connection, item)

    def _deliver_chunk(self, result: StepResult) -> None:
        loan = self.allocator.take(result.session, result.chunk)
        loan.publish()
        owner = self.router.owner(result.session)
        timing = result.timing
        if owner is not None and owner.send(
            self.encode_chunk(
                result.session, result.chunk, loan.ref, timing.generated_ns, timing.emitted_ns
            )
        ):
            self._emitted += 1  # counted once per turn, not per chunk
            return
        self.slab.release(loan.ref)  # nobody will read it
        self.control.count(Counter.CHUNKS_DROPPED)

    def _send(self, connection: Connection, notice: Notice) -> None:
        """An answer to one client; it never fails for its size (truncated to fit)."""
        if not connection.send(encode_notice(notice, connection.outbox.max_record)):
            self.control.count(Counter.NOTICES_DROPPED)

    # -- 5. waiting ---------------------------------------------------------

    def _idle_wait(self) -> None:
        """Nothing to step: wait for a request by the wait policy (bounded: the
        loop must come round to beat, scan clients and notice a stop)."""
        inboxes = [c.inbox for c in self.table.connections.values()]
        if self.policy is not WaitPolicy.BLOCK:
            spin_ns = SPIN_SLICE_NS if self.policy is WaitPolicy.SPIN else SPIN_NS
            end = time.monotonic_ns() + spin_ns
            while time.monotonic_ns() < end:
                if any(ring.used() for ring in inboxes):
                    return
            if self.policy is WaitPolicy.SPIN:
                os.sched_yield()
                return
        wait_any(inboxes, self.bell, IDLE_SLEEP_S, self._woken)

    def _woken(self) -> bool:
        """Other reasons not to sleep: a session could step, or a client is claiming."""
        return self.table.can_step() or self.control.claims != self._claims
