"""The engine daemon: one engine in its own process, served over shared memory.

``rte serve --name NAME`` runs :func:`serve`. The daemon owns a control
segment (see :mod:`rte.control`), a slab segment, its doorbell and one doorbell
per client slot; it creates them at start (replacing a dead daemon's
leftovers, refusing a live one's) and unlinks them all when it stops.

The engine steps on one worker thread for its whole life (CUDA streams are
per-thread). Each turn of that thread is a short numbered sequence:

1. beat the heartbeat; every 100 ms adopt new clients and reap dead ones
   (pid + start time): their sessions are detached, their slots reclaimed and
   their rings emptied, and nobody else notices;
2. drain every client's inbox ring; each record is decoded and checked
   (ownership: a session belongs to the client that attached it) and handed to
   the shared :class:`~rte.serve.ServeLoop`; a bad record gets an ERROR notice
   back to its sender only;
3. step the sessions whose owners have slab quota left (a client that holds
   all its slots stalls only its own sessions); chunks are written by the
   engine straight into slab slots (:class:`SlabAllocator`), published, and
   announced to their owner with a fixed 48-byte record;
4. detach the sessions of a client that has consumed nothing for the idle
   limit, and tell it why;
5. sleep on the doorbell when idle, or until the next tick when paced.

The main thread only waits for SIGTERM/SIGINT (which set a flag and ring the
doorbell) and then joins the worker, which finalizes every session first.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rte.composed import ComposedEngine
from rte.contract import Action, Manifest, ResultKind, StepResult
from rte.control import (
    KIND_CONTROL,
    KIND_SLAB,
    ClientState,
    Control,
    Counter,
    DaemonState,
    Layout,
    client_bell,
    names,
)
from rte.errors import RteError
from rte.models import load_model
from rte.serve import Act, Attach, Detach, Notice, NoticeKind, ServeLoop
from rte.wire import ChunkEncoder, NoticeCode, RecordType, WireError, decode, encode
from shm import (
    Doorbell,
    Lease,
    Ring,
    RingCorrupt,
    RingFull,
    Segment,
    SegmentNotFoundError,
    ShmError,
    Slab,
    WaitPolicy,
    is_alive,
    wait_any,
)
from shm.segment import HEADER_SIZE, SHM_DIR

log = logging.getLogger("rte.daemon")
SCAN_EVERY_S = 0.1
SPIN_NS = 50_000  # spin-then-block: how long an idle daemon polls before it sleeps
SPIN_SLICE_NS = 1_000_000  # spin: how long it polls between yields
CLAIM_GRACE_S = 5.0
BACKLOG_LIMIT = 4096
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NOTICE_CODES = {
    NoticeKind.ATTACHED: NoticeCode.ATTACHED,
    NoticeKind.DETACHED: NoticeCode.DETACHED,
    NoticeKind.REJECTED: NoticeCode.REJECTED,
    NoticeKind.ERROR: NoticeCode.ERROR,
    NoticeKind.DROPPED: NoticeCode.ERROR,
}


class DaemonRunningError(RteError):
    """A live daemon of the same name owns the segments; the new one refuses to start."""


@dataclass(frozen=True)
class Settings:
    """What ``rte serve`` takes on its command line."""

    name: str
    model: str = "reference"
    max_sessions: int = 8
    max_clients: int = 8
    ring_kib: int = 256
    slab_slots: int = 64
    quota: int = 0  # slots one client may hold; 0: slab_slots // max_clients
    pace_hz: float = 0.0  # target steps per second; 0: as fast as possible
    wait_policy: str = "spin-then-block"
    idle_limit_s: float = 30.0
    model_settings: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"daemon name {self.name!r}: 1-64 letters, digits, '_' or '-'")
        if self.max_clients < 1 or self.slab_slots < self.max_clients:
            raise ValueError("need at least one client and at least one slab slot per client")
        WaitPolicy(self.wait_policy)

    @property
    def ring_capacity(self) -> int:
        return 1 << max(12, (self.ring_kib * 1024 - 1).bit_length())

    @property
    def client_quota(self) -> int:
        return self.quota or max(1, self.slab_slots // self.max_clients)


def remove_leftovers(name: str) -> list[str]:
    """Unlink every shared-memory object of daemon ``name``; returns what was removed."""
    stem = f"rte.{os.getuid()}.{name}."
    removed = []
    for entry in SHM_DIR.iterdir():
        if entry.name.startswith((stem, "sem." + stem)):
            entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed


def check_name_free(name: str) -> None:
    """Refuse if a live daemon owns ``name``; remove a dead one's leftovers."""
    try:
        segment = Segment.open(names(name)["control"])
    except SegmentNotFoundError:
        remove_leftovers(name)  # semaphores may outlive a crashed daemon's segment
        return
    except ShmError as exc:
        raise DaemonRunningError(
            f"{names(name)['control']} exists but cannot be read ({exc}); if no daemon "
            f"named {name!r} runs, remove /dev/shm/*rte.{os.getuid()}.{name}.*"
        ) from None
    pid, alive = segment.creator_pid, segment.creator_alive()
    segment.close()
    if alive:
        raise DaemonRunningError(
            f"a daemon named {name!r} is already running (pid {pid}); stop it "
            f"(kill {pid}) or choose another --name"
        )
    removed = remove_leftovers(name)
    log.warning("replaced the leftovers of dead daemon pid %d: %s", pid, ", ".join(removed))


class SlabAllocator:
    """Hands the engine slab slots as output buffers: each chunk is written once,
    in place, where its reader will look at it."""

    def __init__(self, slab: Slab, manifest: Manifest, owners: dict[str, _Client]) -> None:
        self.slab = slab
        self.shape = manifest.latent_shape
        self.dtype = np.dtype(manifest.latent_dtype)
        self.owners = owners
        self.leases: dict[tuple[str, int], Lease] = {}

    def allocate(self, session: str, chunk: int) -> np.ndarray[Any, Any]:
        lease, array = self.slab.acquire_array(self.owners[session].index, self.dtype, self.shape)
        self.leases[(session, chunk)] = lease
        return array

    def discard(self, session: str, chunk: int, buffer: np.ndarray[Any, Any]) -> None:
        lease = self.leases.pop((session, chunk), None)
        if lease is not None:
            self.slab.abort(lease)

    def take(self, session: str, chunk: int) -> Lease:
        return self.leases.pop((session, chunk))


class _Client:
    """The daemon's view of one attached client process."""

    def __init__(self, index: int, pid: int, start: float, inbox: Ring, outbox: Ring) -> None:
        self.index = index
        self.pid = pid
        self.start = start
        self.inbox = inbox
        self.outbox = outbox
        self.sessions: list[str] = []
        self.backlog: collections.deque[bytes] = collections.deque()
        self.stalled_since: float | None = None
        self.turn = 0

    def send(self, record: bytes) -> bool:
        """Push now, or queue behind earlier records; False when the backlog is full."""
        if not self.backlog:
            try:
                self.outbox.push_nowait(record)
                return True
            except RingFull:
                pass
        if len(self.backlog) >= BACKLOG_LIMIT:
            return False
        self.backlog.append(record)
        return True

    def flush(self) -> None:
        while self.backlog:
            try:
                self.outbox.push_nowait(self.backlog[0])
            except RingFull:
                return
            self.backlog.popleft()


class _Outbox:
    """The ServeLoop's outbox: routes each item to the ring of the session's owner."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def put(self, item: object) -> None:
        self.daemon.deliver(item)


class Daemon:
    """Build with :meth:`start`; then :meth:`run` until stopped."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._created: list[Any] = []
        self.clients: dict[int, _Client] = {}
        self.owners: dict[str, _Client] = {}
        self._request: tuple[_Client, int] | None = None
        self._detach_reason: dict[str, str] = {}
        self.failure: BaseException | None = None
        self.policy = WaitPolicy(settings.wait_policy)

    # -- lifecycle --------------------------------------------------------

    def start(self) -> None:
        s = self.settings
        check_name_free(s.name)
        model = load_model(s.model, max_sessions=s.max_sessions, **dict(s.model_settings or {}))
        manifest = model.manifest()
        layout = Layout(s.max_clients, s.ring_capacity)
        n = names(s.name)
        try:
            self.segment = self._own(Segment.create(n["control"], layout.size, kind=KIND_CONTROL))
            self.control = Control.initialise(
                self.segment, layout, s.slab_slots, s.client_quota, manifest
            )
            slab_bytes = HEADER_SIZE + Slab.footprint(
                HEADER_SIZE, s.slab_slots, manifest.latent_nbytes, s.max_clients
            )
            self.slab_segment = self._own(Segment.create(n["slab"], slab_bytes, kind=KIND_SLAB))
            self.slab = Slab.create(
                self.slab_segment,
                HEADER_SIZE,
                slots=s.slab_slots,
                slot_bytes=manifest.latent_nbytes,
                max_owners=s.max_clients,
                quota=s.client_quota,
            )
            self.bell = self._own(Doorbell(n["bell"], create=True))
            self.client_bells = [
                self._own(Doorbell(client_bell(s.name, i), create=True))
                for i in range(s.max_clients)
            ]
            for i in range(s.max_clients):
                Ring.create(self.segment, layout.inbox(i), s.ring_capacity, policy="spin")
                Ring.create(self.segment, layout.outbox(i), s.ring_capacity, policy="spin")
        except BaseException:
            self.cleanup()
            raise
        self.layout = layout
        self.manifest = manifest
        self.allocator = SlabAllocator(self.slab, manifest, self.owners)
        self.engine = ComposedEngine(model, allocator=self.allocator)
        self.loop = ServeLoop(self.engine, _Outbox(self))
        self.encode_chunk = ChunkEncoder(manifest.latent_dtype, manifest.latent_shape)
        self.emitted = 0
        self.pinned = self.slab.pin()

    def _own(self, thing: Any) -> Any:
        self._created.append(thing)
        return thing

    def run(self) -> None:
        """Serve until SIGTERM/SIGINT or :meth:`stop`; always cleans up."""
        worker = threading.Thread(target=self._work, name="rte-engine", daemon=True)
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            self.control.set_state(DaemonState.READY)
            worker.start()
            print(
                f"rte serve: ready name={self.settings.name} pid={os.getpid()} "
                f"model={self.manifest.model} max_sessions={self.manifest.max_sessions} "
                f"max_clients={self.settings.max_clients} lanes={self.engine.lanes.kind} "
                f"slab_pinned={self.pinned}",
                flush=True,
                file=sys.stderr,
            )
            while worker.is_alive():
                worker.join(0.2)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stop.set()
            worker.join(30)
            self.cleanup()
        if self.failure is not None:
            raise self.failure

    def stop(self) -> None:
        self._stop.set()
        self.bell.ring()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop()  # only a flag and a wake-up; the worker does the rest

    def cleanup(self) -> None:
        """Unlink everything this daemon created (idempotent)."""
        for thing in reversed(self._created):  # segments and doorbells alike
            try:
                thing.close()
                thing.unlink()
            except Exception as exc:  # cleanup goes on past one failure
                log.warning("cleanup of %s failed: %s", getattr(thing, "name", thing), exc)
        self._created.clear()

    # -- the worker thread -------------------------------------------------

    def _work(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # the daemon must say why it died
            log.exception("the serve loop failed")
            self.failure = exc
        finally:
            self.control.set_state(DaemonState.STOPPING)
            try:
                for session in list(self.owners):  # in-flight chunks go out where they fit
                    self._detach(session, finalize=True)
            except Exception:
                log.exception("finalizing sessions failed")
            for client in self.clients.values():
                client.flush()
            self.engine.close()
            self.slab.unpin()

    def _serve(self) -> None:
        period = 1.0 / self.settings.pace_hz if self.settings.pace_hz else 0.0
        next_tick = time.monotonic()
        next_scan = 0.0
        while not self._stop.is_set():
            self.control.beat()  # 1.
            now = time.monotonic()
            if now >= next_scan:
                self._scan_clients()
                next_scan = now + SCAN_EVERY_S
            for client in list(self.clients.values()):  # 2.
                client.flush()
                self._drain(client)
            due = self._due()  # 3.
            if due:
                self.loop.step(due)
                self.control.count(Counter.STEPS)
            if self.emitted:
                self.control.count(Counter.CHUNKS, self.emitted)
                self.emitted = 0
            self._check_idle(now)  # 4.
            if period:  # 5.
                next_tick += period
                delay = next_tick - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
                else:
                    next_tick = time.monotonic()
            elif not due:
                self._idle_wait()

    def _idle_wait(self) -> None:
        """Nothing to step: wait for a request by the wait policy (bounded: the
        loop must come round to beat, scan clients and notice a stop)."""
        inboxes = [c.inbox for c in self.clients.values()]
        if self.policy is not WaitPolicy.BLOCK:
            spin_ns = SPIN_SLICE_NS if self.policy is WaitPolicy.SPIN else SPIN_NS
            end = time.monotonic_ns() + spin_ns
            while time.monotonic_ns() < end:
                if any(ring.used() for ring in inboxes):
                    return
            if self.policy is WaitPolicy.SPIN:
                os.sched_yield()
                return
        wait_any(inboxes, self.bell, 0.05, self._can_step)

    def _can_step(self) -> bool:
        """Whether some session could step now (its owner released a slot)."""
        return any(
            c.sessions and self.slab.held(c.index) < self.slab.quota for c in self.clients.values()
        )

    # 1. clients come and go

    def _scan_clients(self) -> None:
        for entry in self.control.clients():
            known = self.clients.get(entry.index)
            if entry.state is ClientState.ACTIVE and known is None:
                self._adopt(entry.index, entry.pid, entry.start)
            elif known is not None and not is_alive(known.pid, known.start):
                log.warning("client %d (pid %d) died; reclaiming", known.index, known.pid)
                self._reap(known)
                self.control.count(Counter.DEAD_CLIENTS_REAPED)
            elif entry.state is ClientState.CLAIMED:
                age = (time.monotonic_ns() - self.control.last_pop_ns(entry.index)) / 1e9
                if age > CLAIM_GRACE_S:  # its claimer died before finishing the claim
                    self.control.set_client_state(entry.index, ClientState.FREE)

    def _adopt(self, index: int, pid: int, start: float) -> None:
        layout = self.layout
        inbox = Ring(self.segment, layout.inbox(index), doorbell=self.bell, policy="spin")
        outbox = Ring(
            self.segment, layout.outbox(index), doorbell=self.client_bells[index], policy="spin"
        )
        self.clients[index] = _Client(index, pid, start, inbox, outbox)
        log.info("client %d (pid %d) attached; %d clients", index, pid, len(self.clients))

    def _reap(self, client: _Client) -> None:
        """Detach a gone client's sessions and give back everything it held."""
        self.control.set_client_state(client.index, ClientState.CLOSING)
        for session in list(client.sessions):
            self._detach(session, finalize=False)  # nobody is left to read its last chunk
        del self.clients[client.index]
        self.slab.reclaim(client.index)
        client.inbox.reset()
        client.outbox.reset()
        self.control.set_client_sessions(client.index, 0)
        self.control.set_client_state(client.index, ClientState.FREE)

    # 2. requests

    def _drain(self, client: _Client) -> None:
        try:
            records = client.inbox.pop_batch_nowait()
        except RingCorrupt:
            client.inbox.reset()
            self._reply(client, "", 0, NoticeCode.ERROR, "RingCorrupt: inbox was reset")
            return
        for raw in records:
            self.control.count(Counter.REQUESTS)
            try:
                record = decode(raw)
            except WireError as exc:
                self._reply(client, "", 0, NoticeCode.ERROR, f"WireError: {exc}")
                continue
            self._request = (client, record.seq)
            try:
                self._handle(client, record.type, record.session, record.value)
            finally:
                self._request = None
            if client.index not in self.clients:
                return  # it said BYE

    def _handle(self, client: _Client, kind: RecordType, session: str, value: Any) -> None:
        owner = self.owners.get(session)
        if kind is RecordType.BYE:
            self._reap(client)
            return
        if kind not in (RecordType.ATTACH, RecordType.ACT, RecordType.DETACH, RecordType.RESET):
            self._error(session, f"WireError: a client cannot send {kind.name} records")
            return
        if owner is not None and owner is not client:
            self._error(session, f"PermissionError: session {session!r} belongs to another client")
            return
        if kind is RecordType.ATTACH:
            if owner is None:
                self.owners[session] = client
                client.sessions.append(session)
            self.loop.handle(Attach(session, value))
            if session not in self.loop.conditioning:
                self._forget(session)  # refused
        elif owner is None:
            self._error(session, f"UnknownSessionError: session {session!r} is not attached")
        elif kind is RecordType.ACT:
            self.loop.handle(Act(session, Action(value)))
        elif kind is RecordType.RESET:
            keep = self.loop.conditioning[session] if value is None else value
            self._detach(session, finalize=True, forget=False)
            self.loop.handle(Attach(session, dict(keep)))
            if session not in self.loop.conditioning:
                self._forget(session)
        else:
            self._detach(session, finalize=True)
        self.control.set_client_sessions(client.index, len(client.sessions))

    def _detach(self, session: str, *, finalize: bool, forget: bool = True) -> None:
        """Detach through the loop; the in-flight chunk goes out only if its owner
        has a free slot for it (else it is dropped, and the owner told so)."""
        owner = self.owners.get(session)
        room = owner is not None and self.slab.held(owner.index) < self.slab.quota
        if finalize and not room and owner is not None:
            self.deliver(
                Notice(
                    session, NoticeKind.DROPPED, "in-flight chunk dropped at detach: no free slot"
                )
            )
        self.loop.handle(Detach(session, finalize=finalize and room))
        if forget and session not in self.loop.conditioning:
            self._forget(session)

    def _forget(self, session: str) -> None:
        client = self.owners.pop(session, None)
        if client is not None and session in client.sessions:
            client.sessions.remove(session)

    # 3. stepping and delivering

    def _due(self) -> list[str]:
        """Sessions whose owner has a free slab slot for them, fairly rotated."""
        due: list[str] = []
        for client in self.clients.values():
            if not client.sessions:
                continue
            room = self.slab.quota - self.slab.held(client.index)
            if room <= 0:
                continue
            n = len(client.sessions)
            start = client.turn % n
            client.turn += 1
            due.extend((client.sessions[start:] + client.sessions[:start])[:room])
        return due

    def deliver(self, item: object) -> None:
        """The ServeLoop's outbox: a chunk or a notice, to its session's owner."""
        if isinstance(item, StepResult) and item.kind is ResultKind.CHUNK:
            self._deliver_chunk(item)
        elif isinstance(item, Notice):
            code = _NOTICE_CODES[item.kind]
            message = item.message
            if item.kind is NoticeKind.DETACHED:
                message = self._detach_reason.pop(item.session, message)
            if item.kind is NoticeKind.ERROR:
                self.control.count(Counter.ERRORS)
            elif item.kind is NoticeKind.DROPPED:
                self.control.count(Counter.CHUNKS_DROPPED)
            elif item.kind is NoticeKind.REJECTED:
                self.control.count(Counter.ADMISSION_REJECTIONS)
            owner = self.owners.get(item.session)
            targets = [owner] if owner is not None else []
            if owner is None and self._request is not None:
                targets = [self._request[0]]
            elif owner is None and not item.session:
                targets = list(self.clients.values())  # an engine-wide failure
            seq = self._request[1] if self._request is not None else 0
            if item.kind is NoticeKind.DROPPED:
                seq = 0  # news, not the answer to the request being handled
            for client in targets:
                self._reply(client, item.session, seq, code, message)

    def _deliver_chunk(self, result: StepResult) -> None:
        lease = self.allocator.take(result.session, result.chunk)
        client = self.owners.get(result.session)
        self.slab.publish(lease)
        if client is None:
            self.slab.release(lease.slot, lease.generation, lease.owner)
            return
        record = self.encode_chunk(
            result.session,
            result.chunk,
            lease.slot,
            lease.generation,
            result.timing.generated_ns,
            result.timing.emitted_ns,
        )
        if client.send(record):
            self.emitted += 1  # counted once per turn, not per chunk
        else:
            self.slab.release(lease.slot, lease.generation, lease.owner)
            self.control.count(Counter.CHUNKS_DROPPED)

    def _reply(self, client: _Client, session: str, seq: int, code: NoticeCode, text: str) -> None:
        if not client.send(encode(RecordType.NOTICE, session, seq, code, text.encode())):
            self.control.count(Counter.CHUNKS_DROPPED)

    def _error(self, session: str, text: str) -> None:
        """Refuse the request being handled: the answer goes to its sender."""
        assert self._request is not None
        client, seq = self._request
        self.control.count(Counter.ERRORS)
        self._reply(client, session, seq, NoticeCode.ERROR, text)

    # 4. clients that stopped consuming

    def _check_idle(self, now: float) -> None:
        limit = self.settings.idle_limit_s
        for client in list(self.clients.values()):
            stalled = client.sessions and (
                client.backlog
                or self.slab.held(client.index) >= self.slab.quota
                or client.outbox.used() > 0
            )
            if not stalled:
                client.stalled_since = None
                continue
            last_pop = self.control.last_pop_ns(client.index) / 1e9
            since = max(client.stalled_since or now, last_pop)
            client.stalled_since = client.stalled_since or now
            if now - since > limit:
                for session in list(client.sessions):
                    self._detach_reason[session] = (
                        f"idle: nothing consumed for {limit:g}s (the idle limit)"
                    )
                    self._detach(session, finalize=False)
                    self.control.count(Counter.IDLE_DETACHES)
                self.control.set_client_sessions(client.index, 0)
                client.stalled_since = None


def serve(settings: Settings) -> None:
    """Run a daemon in this process until SIGTERM/SIGINT."""
    daemon = Daemon(settings)
    daemon.start()
    daemon.run()


def daemon_pid(name: str) -> int | None:
    """The pid of the live daemon ``name``, or None."""
    try:
        segment = Segment.open(names(name)["control"])
    except ShmError:
        return None
    try:
        return segment.creator_pid if segment.creator_alive() else None
    finally:
        segment.close()


__all__ = [
    "Daemon",
    "DaemonRunningError",
    "Settings",
    "SlabAllocator",
    "check_name_free",
    "daemon_pid",
    "remove_leftovers",
    "serve",
]
