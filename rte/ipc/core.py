"""The daemon's core loop: one engine served to many clients over their rings.

It runs on the daemon's worker thread for the engine's whole life (CUDA
streams are per-thread); :mod:`rte.ipc.process` creates what it runs on and
stops it. Each turn is a short numbered sequence:

1. beat the heartbeat; adopt new clients and reap dead ones (their sessions
   are detached, their slots and rings given back; nobody else notices);
   publish how many sessions it holds (what ``rte drain`` waits to see at 0:
   :mod:`rte.ipc.draining`);
2. drain every client's inbox (:class:`~rte.ipc.intake.Intake`): each record
   is decoded, checked by the :class:`~rte.ipc.router.Router` (ownership) and
   handed to the shared :class:`~rte.serve.ServeLoop`; a bad record gets an
   ERROR back to its sender only, and nothing one client sends can end the loop;
3. step the due sessions (those with credit left, whose owners have slab
   quota left); the engine writes each client's chunks of the step straight
   into one run of slab slots (:class:`~rte.ipc.allocator.SlabAllocator`); the
   step returns them as their leases (the serve loop's ``emit``), and
   :class:`~rte.ipc.outbound.Outbound` publishes each owner's and announces
   them in one STEP record written from its leases alone;
4. detach the sessions of a client that consumed nothing for the idle limit,
   and tell it why; disconnect a client that floods requests without reading
   (every way a session or client leaves: :mod:`rte.ipc.departures`);
5. wait: on the doorbell when idle (by the wait policy; a client whose
   sessions are out of credit is marked starved, so that its next release
   rings), or for the next tick when paced (the shared
   :class:`~rte.realtime.Pacer`; the tick is published in the control block
   before each turn, so that clients spin only around it).

A wait that sleeps costs a post and a wake-up (~145 µs on a small VM), so the
idle wait first spins, yielding the core, for as long as recent waits lasted
(:class:`~shm.waiting.AdaptiveSpin`, at most half a millisecond), and only while
sessions are attached: a daemon without sessions never spins. Once awake it
clears the starved marks, so clients do not post to a daemon that is not
asleep. The paced wait naps until just before the tick, then spins (not yielding).
How the loop waited (waits, sleeps, wake-ups received) is counted into the
control block's counters with the steps (``rte inspect`` shows them per step).

Each turn is bracketed by the serve loop's ``begin_turn``/``end_turn``: its
cost model, real-time admission and overload governor are the in-process
host's too. What they know (capacity, pace, sessions attached and reduced, the
cost model, late ticks) is published in the control block for ``rte inspect``
and Prometheus (:func:`rte.ipc.figures.publish_realtime`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from rte.composed import ComposedEngine
from rte.errors import EngineFault
from rte.ipc.allocator import SlabAllocator
from rte.ipc.checkpoints import Checkpoints
from rte.ipc.clients import ClientTable, Connection
from rte.ipc.departures import Departures
from rte.ipc.draining import Draining
from rte.ipc.figures import FLUSH_NS, publish_realtime
from rte.ipc.inputs import Inputs
from rte.ipc.intake import Intake
from rte.ipc.outbound import Outbound
from rte.ipc.router import Router
from rte.ipc.settings import Settings
from rte.protocol.control import Control, Counter, DaemonState
from rte.replica import ReplicaEngine
from rte.serve import ServeLoop
from rte.stages import StageModel
from shm import Doorbell, Segment, Slab, WaitPolicy, wait_any
from shm.fifo import FifoBell
from shm.waiting import AdaptiveSpin, WaitTally

log = logging.getLogger("rte.daemon")
SCAN_EVERY_S = 0.1
IDLE_SLEEP_NS = 50_000_000  # the longest sleep: the loop must come round to beat and scan
# the longest sleep while sessions are attached: the figures' steps kept older
# than this are counted before it (none then waits past FLUSH_NS, see _before_sleep)
ATTACHED_SLEEP_NS = FLUSH_NS // 2
NAP_CHECK_S = 0.05  # a paced nap looks at ``stopping`` at least this often
IDLE_CHECK_EVERY_S = 0.01  # idle and flooding clients are looked for this often
BEAT_EVERY_S = 0.001  # the heartbeat and the step and chunk counters are written this often
IDLE_SPIN_FLOOR_NS = 50_000  # the idle wait spins at least this long while sessions are attached


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
        router = self.router
        owners = router.owners.__getitem__
        self.allocator = SlabAllocator(shared.slab, manifest, owners, lambda: router.version)
        self.engine = _engine(model, load, settings.engines, self.allocator)
        self.loop = ServeLoop(
            self.engine,
            pace_hz=settings.pace_hz,
            admission=settings.admission,
            margin=settings.realtime_margin,
            stamp=False,  # Outbound reads the receipts into each STEP record
            emit=self.allocator.emitted,  # a step returns its chunks as their leases
            park_bytes=settings.park_bytes,
            park_idle_s=settings.park_idle_s,
        )
        rows = shared.control.manifest().max_sessions
        every = settings.checkpoint_every
        # a slot for every session the daemon may hold: more than its rows when
        # clients may hold more (--sessions-per-client), their parked ones included
        held = rows if settings.handles <= rows else settings.max_clients * settings.handles
        self.checkpoints = Checkpoints(settings.names, every, held) if every else None
        self.out = Outbound(shared.control, shared.slab, self.table, self.router)
        self.out.receipts = self.loop.receipts
        parts = (self.control, self.loop, self.table, self.router, self.inputs, self.out)
        self.departures = Departures(*parts)
        self.draining = Draining(
            settings.names.daemon, self.control, self.router, self.departures, self.out
        )
        self.intake = Intake(*parts, self.departures, self.draining)
        self.policy = WaitPolicy(settings.wait_policy)
        self.tally = WaitTally()  # how the idle wait waited (counted with the steps)
        self.spin = AdaptiveSpin(IDLE_SPIN_FLOOR_NS)
        self.step_times = shared.control.step_histogram  # for rte inspect and Prometheus
        self.failure: BaseException | None = None
        self._next_scan = 0.0
        self._next_idle_check = 0.0
        self._next_beat = 0.0
        self._steps = 0  # steps since the counters were last written
        self._claims = -1
        self._sleep_ns = IDLE_SLEEP_NS  # how long the idle wait about to sleep may sleep
        self._parked_shown: set[int] = set()  # clients whose figures show a parked session

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
                    self._count_figures()  # (the tick's wait is idle time)
                    pacer.wait(lambda nap: self._nap(stopping, nap))
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
            self._count_figures(time.monotonic_ns())
        claims = self.control.claims
        if now >= self._next_scan or claims != self._claims:
            self._claims, self._next_scan = claims, now + SCAN_EVERY_S
            for dead in self.table.scan():
                self.departures.reap(dead)
                self.control.count(Counter.DEAD_CLIENTS_REAPED)
            self.departures.retry_orphans(now)
            self.draining.publish()  # the sessions held (what rte drain waits to see 0)
            publish_realtime(self.control, self.loop, self.settings.pace_hz)
            self._publish_parked()
        for connection in list(self.table.connections.values()):  # 2.
            self._serve(connection)
        stepped = self._step()  # 3.
        if now >= self._next_idle_check:  # 4.
            self._next_idle_check = now + IDLE_CHECK_EVERY_S
            self.departures.idle_and_flooding(now, self.settings.idle_limit_s)
            self.out.deliver(self.loop.park_idle(), None)  # (news for their owners)
        return stepped

    def _serve(self, connection: Connection, requests_only: bool = False) -> None:
        """A client's backlog flushed and its requests handled (only those, given
        ``requests_only``); a client that breaks the protocol is disconnected."""
        try:
            if connection.backlog and not requests_only:
                connection.flush()
            if connection.dropped and not connection.backlog and not requests_only:
                self.out.tell_dropped(connection)
            if connection.inbox.used():
                self.intake.drain(connection)
        except EngineFault:
            raise  # the device failed for everyone: fail closed
        except Exception:  # one client's traffic never ends the loop for everyone
            log.exception("client %d broke the protocol: disconnected", connection.index)
            reason = "disconnected: protocol error"
            self.departures.reap(connection, reason=reason, revoked=True)

    def _step(self) -> bool:
        """Step the due sessions and deliver their chunks; False when none was due."""
        due = self.loop.parking.runnable(self.table.due())  # (not the suspended)
        if not due:
            if not self.router.owners and not self.departures.orphans:
                self.inputs.settle()
            return False
        started = time.monotonic_ns()
        self.inputs.step_begins(due)
        outcome = self.loop.step(due)
        self.inputs.step_ended()
        self.step_times.add(time.monotonic_ns() - started)
        left = self.departures.detached_by(outcome)
        self.out.deliver(outcome, None)
        self.departures.detached(left)  # detached by the step (their own failure)
        if self.checkpoints is not None:  # after the step's chunks went out
            self.checkpoints.after_step(self.loop, due)
        self._steps += 1
        return True

    def _publish_parked(self) -> None:
        """Each parked session's bytes into its figures (for rte inspect)."""
        parked = self.loop.parking.parked
        for connection in self.table.connections.values():
            shown = connection.index in self._parked_shown
            if connection.figures is not None and (parked or shown):
                handles = connection.handles
                mine = {handles[s]: p.nbytes for s, p in parked.items() if s in handles}
                connection.figures.parked(mine)
                (self._parked_shown.add if mine else self._parked_shown.discard)(connection.index)

    def _count_figures(self, now_ns: int = 0) -> None:
        """Count the steps each client's figures keep (those kept longer than
        ``FLUSH_NS`` only, given ``now_ns``): rte.ipc.figures counts them together."""
        for connection in self.table.connections.values():
            if connection.figures is not None:
                if now_ns:
                    connection.figures.flush_stale(now_ns)
                else:
                    connection.figures.flush()

    def _count_steps(self) -> None:
        """Add the steps and chunks since the last call to the daemon's counters."""
        if self._steps:
            self.control.count(Counter.STEPS, self._steps)
            self._steps = 0
        if self.tally.waits:
            waited = self.tally.taken()
            self.control.count(Counter.IDLE_WAITS, waited.waits)
            self.control.count(Counter.IDLE_SLEEPS, waited.sleeps)
            self.control.count(Counter.WAKEUPS, waited.wakeups)
        self.out.count_chunks()

    def finish(self) -> None:
        """Finalize every session (in-flight chunks go out where they fit), close the engine."""
        self._count_steps()
        self._count_figures()
        publish_realtime(self.control, self.loop, self.settings.pace_hz)
        if self.failure is not None:  # clients' EngineGone says it
            self.control.set_reason(f"{type(self.failure).__name__}: {self.failure}")
        self.control.set_state(DaemonState.STOPPING)
        try:
            if not isinstance(self.failure, EngineFault):  # a failed device finalizes nothing
                self.departures.everyone()
            self.engine.close()
            if self.checkpoints is not None:
                self.checkpoints.close()  # a clean stop: no session to come back to
        except EngineFault as fault:  # the device failed while stopping: say so, stop anyway
            log.error("the engine's device failed while stopping: %s", fault)
            self.failure = self.failure or fault
        for connection in self.table.connections.values():
            connection.flush()

    # -- 5. waiting ---------------------------------------------------------

    def _idle_wait(self) -> None:
        """Nothing to step: wait for a request by the wait policy (bounded: the
        loop must come round to beat, scan clients and notice a stop). The
        counters are written first: an inspector must not see steps missing for
        as long as the daemon sleeps."""
        self._count_steps()
        connections = list(self.table.connections.values())
        inboxes = [c.inbox for c in connections]
        attached = bool(self.router.owners)
        policy = self.policy
        if policy is WaitPolicy.SPIN_THEN_BLOCK and not attached:
            policy = WaitPolicy.BLOCK  # nobody to wait for soon: never spin idle
        self._sleep_ns = ATTACHED_SLEEP_NS if attached else IDLE_SLEEP_NS
        began = time.monotonic_ns()
        woken = wait_any(
            inboxes,
            self.bell,
            self._sleep_ns / 1e9,
            self._woken,
            policy=policy,
            spin_us=self.spin.budget_ns() / 1000,
            before_sleep=self._before_sleep,
            tally=self.tally,
        )
        if attached:
            waited = _came(began, connections) if woken else time.monotonic_ns() - began
            self.spin.observe(waited, woken)
        for connection in connections:  # awake now: a release need not ring
            connection.block.feed()

    def _before_sleep(self) -> None:
        """The idle wait is about to sleep: the clients' next releases ring (_woken
        re-checks), and the figures' steps that would be kept past ``FLUSH_NS`` by
        the end of the sleep are counted (an inspector sees none later than that).
        Not all of them: flat out at one session the daemon sleeps for its client's
        release after every step or two, and a flush each time cost as much as a
        step's old per-step update (py-spy: 9% of its time)."""
        self.table.starve()
        self._count_figures(time.monotonic_ns() + self._sleep_ns)

    def _nap(self, stopping: threading.Event, seconds: float) -> bool:
        """The paced wait's sleep (see :meth:`rte.realtime.Pacer.wait`), True when
        stopping: asleep on the clients' inboxes, their requests answered as they
        come; the pacer spins the rest to the tick without yielding. (A spin
        that yielded the core every 100 µs let a busy neighbour run a time slice
        through the tick: turns began 1.4 to 11 ms late on a loaded 2-core box.)"""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and not stopping.is_set():
            # a request that comes meanwhile (an export, an attach: a session moving
            # between paced daemons) is answered now, not at the next tick
            connections = list(self.table.connections.values())
            if not wait_any([c.inbox for c in connections], self.bell, min(left, NAP_CHECK_S)):
                continue
            for connection in connections:
                if connection.index in self.table.connections and connection.inbox.used():
                    self._serve(connection, requests_only=True)
        return stopping.is_set()

    def _woken(self) -> bool:
        """Other reasons not to sleep: a session could step, or a client is claiming."""
        return self._can_step() or self.control.claims != self._claims

    def _can_step(self) -> bool:
        """Whether a session could step now: one with credit, not suspended."""
        if not self.loop.parking.parked:
            return self.table.can_step()
        return bool(self.loop.parking.runnable(self.table.due()))


def _came(began: int, connections: list[Connection]) -> int:
    """How long after ``began`` what ended an idle wait came: the newest credits a
    client gave back (stamped in its credit block) or request it pushed (stamped
    in its inbox ring), not when this thread woke. A wait that slept lasts a
    wake-up longer (~145 us on a small VM); learning that as waiting once pushed
    a client's spin past its cap and into sleeping on every record
    (:func:`shm.waiting.wait_used` learns the same way). Without a stamp after
    ``began`` (woken by a claim), the wait's own length."""
    end = time.monotonic_ns()
    came = max((max(c.block.given_ns(), c.inbox.last_push_ns()) for c in connections), default=0)
    return (min(end, came) if came > began else end) - began


def _engine(
    model: StageModel,
    load: Callable[[], StageModel] | None,
    engines: int,
    allocator: SlabAllocator,
) -> ComposedEngine | ReplicaEngine:
    """The daemon's engine: ``model``'s, or ``engines`` of them (the others' models
    from ``load``), every chunk written where ``allocator`` says (one slab)."""
    if engines <= 1:  # (its chunks go out from the allocator's leases: no result object each)
        return ComposedEngine(model, allocator=allocator, lazy_results=True)
    first: list[StageModel] = [model]
    more = load or (lambda: model)
    return ReplicaEngine.of_model(
        lambda: first.pop() if first else more(), engines, allocator=allocator
    )
