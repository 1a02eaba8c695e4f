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
3. step the due sessions (those with credit left, whose owners have slab
   quota left); the engine writes each client's chunks of the step straight
   into one run of slab slots (:class:`~rte.ipc.allocator.SlabAllocator`), and
   :class:`~rte.ipc.outbound.Outbound` publishes them and announces them to
   their owner in one STEP record;
4. detach the sessions of a client that consumed nothing for the idle limit,
   and tell it why; disconnect a client that floods requests without reading;
5. wait: on the doorbell when idle (by the wait policy; a client whose
   sessions are out of credit is marked starved, so that its next release
   rings), or for the next tick when paced (the shared
   :class:`~rte.realtime.Pacer`; the tick is published in the control block
   before each turn, so that clients spin only around it).

Each turn is bracketed by the serve loop's ``begin_turn``/``end_turn``: its
cost model, real-time admission and overload governor are the in-process
host's too. What they know (capacity, pace, sessions attached and reduced, the
cost model, late ticks) is published in the control block for ``rte inspect``
and Prometheus (:meth:`DaemonCore.publish_realtime`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from rte.composed import ComposedEngine
from rte.contract import Notice, NoticeKind
from rte.errors import EngineFault
from rte.ipc.allocator import SlabAllocator
from rte.ipc.clients import ClientTable, Connection
from rte.ipc.figures import publish_realtime
from rte.ipc.inputs import InputRefused, Inputs
from rte.ipc.outbound import Outbound
from rte.ipc.router import Router
from rte.ipc.settings import Settings
from rte.protocol.control import Control, Counter, DaemonState
from rte.protocol.inputs import conditioning_of, with_conditioning
from rte.protocol.requests import Act, Attach, Detach, Request, Reset
from rte.protocol.wire import Bye, decode_request, request_seq
from rte.replica import ReplicaEngine
from rte.serve import OutboxItem, ServeLoop
from rte.stages import StageModel
from shm import Doorbell, RingCorrupt, Segment, Slab, WaitPolicy, wait_any
from shm.fifo import FifoBell
from shm.slab import Sample

log = logging.getLogger("rte.daemon")
_COMINGS = {NoticeKind.ATTACHED, NoticeKind.DETACHED}
_LOGGED = {*_COMINGS, NoticeKind.ERROR, NoticeKind.REJECTED}
SCAN_EVERY_S = 0.1
IDLE_SLEEP_S = 0.05  # the longest sleep: the loop must come round to beat and scan
ORPHAN_RETRY_S = 1.0  # how often the detach of a session the engine kept is retried
IDLE_CHECK_EVERY_S = 0.01  # idle and flooding clients are looked for this often
BEAT_EVERY_S = 0.001  # the heartbeat and the step and chunk counters are written this often


@dataclasses.dataclass(frozen=True)
class Shared:
    """The shared objects a daemon serves on (made by :mod:`rte.ipc.process`)."""

    segment: Segment
    control: Control
    slab: Slab
    bell: Doorbell
    client_bells: list[Doorbell]
    client_wakes: list[FifoBell]  # the same, as FIFOs: for clients on an event loop
    # each client's input slab, by client slot (none: no inputs by slot)
    inputs: list[Slab] = dataclasses.field(default_factory=list)
    figures: Segment | None = None  # each session's real-time figures (rte.ipc.figures)


class DaemonCore:
    """The serve loop of a daemon: build it, then :meth:`run` on the worker thread."""

    def __init__(
        self,
        settings: Settings,
        shared: Shared,
        model: StageModel,
        load: Callable[[], StageModel] | None = None,
    ) -> None:
        """``model`` is the engine's (the first engine's, with ``--engines N``: the
        others' models come from ``load``)."""
        self.settings = settings
        self.control = shared.control
        self.bell = shared.bell
        self.table = ClientTable(
            shared.control,
            shared.segment,
            shared.slab,
            shared.bell,
            shared.client_bells,
            shared.client_wakes,
            shared.figures,
            round(1e9 / settings.pace_hz) if settings.pace_hz else 0,
        )
        self.router = Router(settings.credits, settings.client_quota)
        self.inputs = Inputs(shared.inputs)
        manifest = model.manifest()
        self.allocator = SlabAllocator(shared.slab, manifest, self.router.owners.__getitem__)
        self.engine: ComposedEngine | ReplicaEngine
        if settings.engines > 1:  # several engines, one slab: every child writes into it
            first: list[StageModel] = [model]
            more = load or (lambda: model)
            self.engine = ReplicaEngine.of_model(
                lambda: first.pop() if first else more(), settings.engines, allocator=self.allocator
            )
        else:
            self.engine = ComposedEngine(model, allocator=self.allocator)
        self.loop = ServeLoop(
            self.engine,
            pace_hz=settings.pace_hz,
            admission=settings.admission,
            margin=settings.realtime_margin,
            stamp=False,  # Outbound reads the receipts into each STEP record
        )
        self.out = Outbound(shared.control, shared.slab, self.table, self.router, self.allocator)
        self.out.receipts = self.loop.receipts
        self.policy = WaitPolicy(settings.wait_policy)
        self.step_times = shared.control.step_histogram  # for rte inspect and Prometheus
        self.failure: BaseException | None = None
        self._next_scan = 0.0
        self._next_idle_check = 0.0
        self._next_beat = 0.0
        self._steps = 0  # steps since the counters were last written
        self._claims = -1
        self._orphans: set[str] = set()  # detached from their client, not from the engine
        self._next_orphan_retry = 0.0

    def run(self, stopping: threading.Event) -> None:
        """Serve until ``stopping`` is set; then finalize every session. A failure
        of the loop itself is kept in :attr:`failure` (the process reports it)."""
        pacer = self.loop.pacer
        publish_realtime(self.control, self.loop, self.settings.pace_hz)
        try:
            while not stopping.is_set():
                self.loop.begin_turn()
                if pacer is not None:  # 5. clients may sleep until just before the next one
                    self.control.set_next_tick(int(pacer.next_tick * 1e9))
                stepped = self.turn()
                self.loop.end_turn()
                if pacer is not None:
                    pacer.wait(stopping.wait)
                elif not stepped:
                    self._idle_wait()
        except BaseException as exc:  # the daemon must say why it died
            log.exception("the serve loop failed")
            self.failure = exc
        finally:
            self.finish()

    def turn(self) -> bool:
        """One turn of the loop; True when some session stepped."""
        now = time.monotonic()
        if now >= self._next_beat:  # 1. (the heartbeat and counters say "seconds ago")
            self._next_beat = now + BEAT_EVERY_S
            self.control.beat()
            self._count_steps()
        claims = self.control.claims
        if now >= self._next_scan or claims != self._claims:
            self._claims, self._next_scan = claims, now + SCAN_EVERY_S
            for dead in self.table.scan():
                self._reap(dead)
                self.control.count(Counter.DEAD_CLIENTS_REAPED)
            self._retry_orphans(now)
            publish_realtime(self.control, self.loop, self.settings.pace_hz)
        for connection in list(self.table.connections.values()):  # 2.
            try:
                if connection.backlog:
                    connection.flush()
                if connection.dropped and not connection.backlog:
                    self.out.tell_dropped(connection)
                if connection.inbox.used():
                    self._drain(connection)
            except EngineFault:
                raise  # the device failed for everyone: fail closed
            except Exception:  # one client's traffic never ends the loop for everyone
                log.exception("client %d broke the protocol: disconnected", connection.index)
                self._reap(connection, reason="disconnected: protocol error", revoked=True)
        due = self.table.due()  # 3.
        if due:
            started = time.monotonic_ns()
            self.inputs.step_begins(due)
            outcome = self.loop.step(due)
            self.inputs.step_ended()
            self.step_times.add(time.monotonic_ns() - started)
            left = self._leaving(outcome) if outcome and type(outcome[-1]) is Notice else []
            self.out.deliver(outcome, None)
            for session, owner in left:  # detached by the step (its own failure)
                self.inputs.drop(session)
                self.table.publish_sessions(owner)
            self._steps += 1
        elif not self.router.owners and not self._orphans:
            self.inputs.settle()
        if now < self._next_idle_check:
            return bool(due)
        self._next_idle_check = now + IDLE_CHECK_EVERY_S
        limit = self.settings.idle_limit_s  # 4.
        for idle in self.table.idle(now, limit):
            reason = f"idle: nothing consumed for {limit:g}s (the idle limit)"
            for session in list(idle.sessions):
                self._detach(session, reason=reason, finalize=False)
                self.control.count(Counter.IDLE_DETACHES)
            self.table.publish_sessions(idle)
        for flooder in self.table.overflowing(now, limit):
            log.warning(
                "client %d (pid %d) reads no answers: disconnected", flooder.index, flooder.pid
            )
            reason = "disconnected: its client sent requests without reading the answers"
            self._reap(flooder, reason=reason, revoked=True)
            self.control.count(Counter.CLIENTS_DISCONNECTED)
        return bool(due)

    def _leaving(self, outcome: list[OutboxItem]) -> list[tuple[str, Connection]]:
        """The sessions ``outcome`` detaches, with their owners (before it unbinds them)."""
        detached = NoticeKind.DETACHED
        return [
            (item.session, owner)
            for item in outcome
            if type(item) is Notice
            and item.kind is detached
            and (owner := self.router.owner(item.session)) is not None
        ]

    def _count_steps(self) -> None:
        """Add the steps and chunks since the last call to the daemon's counters."""
        if self._steps:
            self.control.count(Counter.STEPS, self._steps)
            self._steps = 0
        self.out.count_chunks()

    def finish(self) -> None:
        """Finalize every session (in-flight chunks go out where they fit), close the engine."""
        self._count_steps()
        publish_realtime(self.control, self.loop, self.settings.pace_hz)
        if self.failure is not None:  # clients' EngineGone says it
            self.control.set_reason(f"{type(self.failure).__name__}: {self.failure}")
        self.control.set_state(DaemonState.STOPPING)
        try:
            if not isinstance(self.failure, EngineFault):  # a failed device finalizes nothing
                for session in [*self.router.owners, *self._orphans]:
                    self._detach(session)
            self.engine.close()
        except EngineFault as fault:  # the device failed while stopping: say so, stop anyway
            log.error("the engine's device failed while stopping: %s", fault)
            self.failure = self.failure or fault
        for connection in self.table.connections.values():
            connection.flush()

    # -- 2. requests --------------------------------------------------------

    def _drain(self, connection: Connection) -> None:
        try:
            records = connection.inbox.pop_batch_nowait()
        except RingCorrupt:
            connection.inbox.reset()
            self.out.send(connection, Notice("", NoticeKind.ERROR, "RingCorrupt: inbox was reset"))
            return
        for raw in records:
            self.control.count(Counter.REQUESTS)
            self._request(connection, raw)
            if connection.index not in self.table.connections:
                return  # it said BYE

    def _request(self, connection: Connection, raw: bytes) -> None:
        try:
            message = decode_request(raw)
        except Exception as exc:  # WireError; anything else is a decoder bug, refused alike
            text = f"{type(exc).__name__}: {exc}"
            log.warning("client %d: a record refused: %s", connection.index, text)
            self.out.deliver([Notice("", NoticeKind.ERROR, text, request_seq(raw))], connection)
            return
        if isinstance(message, Bye):
            log.info("client %d (pid %d) left", connection.index, connection.pid)
            self._reap(connection)
            return
        refusal_text = self.router.refuse(connection, message)
        if message.session in self._orphans:
            refusal_text = f"session {message.session!r} is being detached; try again later"
        if refusal_text is not None:
            log.warning("client %d: refused: %s", connection.index, refusal_text)
            refusal = Notice(message.session, NoticeKind.ERROR, refusal_text, message.seq)
            self.out.send(connection, refusal)
            self.control.count(Counter.ERRORS)
            self.inputs.unused(connection.index, conditioning_of(message))
            return
        if isinstance(message, Detach | Reset) and not self._room_to_finalize(message.session):
            message = dataclasses.replace(message, finalize=False)
        try:  # inputs lent by slot: read-only views of the client's slots
            resolved, samples = self.inputs.resolve(connection.index, conditioning_of(message))
        except InputRefused as exc:
            log.warning("client %d: refused: %s", connection.index, exc)
            refusal = Notice(message.session, NoticeKind.ERROR, str(exc), message.seq)
            self.out.send(connection, refusal)
            self.control.count(Counter.ERRORS)
            return
        if samples:
            message = with_conditioning(message, resolved or {})
        # an attach of a session this client has already: the engine keeps what it had
        again = isinstance(message, Attach) and message.session in connection.sessions
        credits = 0  # what an ATTACHED binds the session with (0: the default)
        if isinstance(message, Attach):
            credits = message.credits
        elif isinstance(message, Reset) and message.session in connection.handles:
            credits = int(connection.credits[connection.handles[message.session]])
        answers = self.loop.handle(message)
        if not answers and type(message) is Act and connection.figures is not None:
            handle = connection.handles[message.session]  # timed to its photon
            connection.figures.acted(handle, message.seq, time.monotonic_ns())
        for answer in answers:  # sessions coming and going, and refusals, for the log
            if isinstance(answer, Notice) and answer.kind in _LOGGED:
                level = logging.INFO if answer.kind in _COMINGS else logging.WARNING
                text = f": {answer.message}" if answer.message else ""
                what = f"{answer.kind.name.lower()} {answer.session!r}{text}"
                log.log(level, "client %d: %s", connection.index, what)
        if self.inputs.by_slot:
            self._track_inputs(message, answers, samples, again)
        self.out.deliver(answers, connection, credits)
        self.table.publish_sessions(connection)

    def _track_inputs(
        self, message: Request, answers: list[OutboxItem], samples: dict[str, Sample], again: bool
    ) -> None:
        """Which input slots the session's conditioning now holds, after the loop
        took (or refused, or, ``again``, ignored) ``message``."""
        if again:
            self.inputs.refused(samples)
            return
        for answer in answers:
            if (
                isinstance(answer, Notice)
                and answer.seq == message.seq
                and answer.kind in (NoticeKind.ERROR, NoticeKind.REJECTED)
            ):
                self.inputs.refused(samples)
                return
        conditioning = conditioning_of(message)
        if isinstance(message, Detach) or (isinstance(message, Reset) and conditioning is not None):
            self.inputs.drop(message.session)
        if conditioning:
            self.inputs.taken(message.session, conditioning, samples)

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
        self.out.deliver([dropped], None)
        return False

    def _detach(self, session: str, *, reason: str = "", finalize: bool = True) -> bool:
        """Detach through the loop; True when the session is gone. Chunks finalized
        before a failure still go out; the engine keeps a session whose detach failed."""
        finalize = finalize and self._room_to_finalize(session)
        out: list[OutboxItem] = []
        try:
            self.loop.detach(session, finalize=finalize, reason=reason, out=out)
            self.inputs.drop(session)
            gone = True
        except EngineFault:
            raise
        except Exception as exc:
            text = f"detach failed: {type(exc).__name__}: {exc}"
            out.append(Notice(session, NoticeKind.ERROR, text))
            gone = False
        self.out.deliver(out, None)
        return gone

    def _reap(self, connection: Connection, *, reason: str = "", revoked: bool = False) -> None:
        """Detach a gone (or leaving, or revoked) client's sessions, give back all it
        held. A session the engine would not detach is kept as an orphan, owned by
        nobody, and its detach retried (never bound to a slot a new client takes)."""
        for session in list(connection.sessions):
            # nobody is left to read its last chunk
            if not self._detach(session, reason=reason, finalize=False):
                self.router.release(session)
                self._orphans.add(session)
        self.inputs.reset(connection.index)  # its input segment, before its slot is free
        self.table.remove(connection, revoked=revoked)

    def _retry_orphans(self, now: float) -> None:
        if self._orphans and now >= self._next_orphan_retry:
            self._next_orphan_retry = now + ORPHAN_RETRY_S
            self._orphans = {s for s in self._orphans if not self._detach(s, finalize=False)}

    # -- 5. waiting ---------------------------------------------------------

    def _idle_wait(self) -> None:
        """Nothing to step: wait for a request by the wait policy (bounded: the
        loop must come round to beat, scan clients and notice a stop). The
        counters are written first: an inspector must not see steps missing for
        as long as the daemon sleeps."""
        self._count_steps()
        inboxes = [c.inbox for c in self.table.connections.values()]
        wait_any(
            inboxes,
            self.bell,
            IDLE_SLEEP_S,
            self._woken,
            policy=self.policy,
            before_sleep=self.table.starve,  # their next release rings; _woken re-checks
        )

    def _woken(self) -> bool:
        """Other reasons not to sleep: a session could step, or a client is claiming."""
        return self.table.can_step() or self.control.claims != self._claims
