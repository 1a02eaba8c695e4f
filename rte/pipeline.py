"""The step body of a ComposedEngine: HOT and DEFERRED on the lanes, and the failure boundary.

:class:`Pipeline` issues a step's work for a :class:`~rte.arena.Plan`: HOT on
the plan's hot rows (one batch, its marker set after HOT), DEFERRED on the
batches decoded this step (each waits for its HOT marker, writes into the
buffers the output side allocates, :mod:`rte.output`), then one ``publish``.
Chunks a resumed session made before its suspend (:class:`Restored`) are
held as any HOT batch is, and DEFERRED copies them into the buffers instead
of decoding them.
Pipelined (``pipeline_depth_chunks == 2``), DEFERRED(N-1) is issued before
HOT(N), so on streams they overlap, and the HOT batch is held until a later
step or finalize takes its rows. Nothing here waits for a lane but the
publish, and it comes after the step's HOT launch.

The host's share of a step (:class:`HostShare`, t_host) is timed here: from
the return of a step's publish wait (its DEFERRED seen complete) to the next
step's HOT launch. With ``fenced`` publishing that time leaves the critical
path: a step returns without waiting for its own DEFERRED (its results'
frames are still being written, behind a fence), and the next step waits for
that fence only after it has launched its HOT, so the device has a decode
queued while the host is between steps. The caller hands a step's frames on
only after the next step (or :meth:`Pipeline.published`) returns; on the
simulated device every hand-out checks that its frames were waited for.

The failure boundary is here too: :meth:`Pipeline.fail` drains every lane and
discards all in-flight output, so nothing is ever emitted stale or twice; a
device that stays failed (a sticky CUDA error) ends the engine
(:class:`~rte.errors.EngineFault`), and :attr:`Pipeline.fault` says so from
then on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from rte.arena import Arena, Plan
from rte.contract import Manifest
from rte.errors import EngineFault
from rte.lanes import Lane, Lanes, LanesFault
from rte.output import InFlight, OutputAllocator
from rte.stages import Batch, Stage


class Pipeline:
    """Args:
    lanes: where the stages run.
    stages: the model's stages (its HOT and DEFERRED ones run here).
    manifest: the model's (whether it is pipelined).
    arena: the engine's rows (their ages, their conditioning's generation).
    allocator: where DEFERRED writes each chunk.
    fenced: a step returns before its DEFERRED completes; the next one waits for it.
    """

    def __init__(
        self,
        lanes: Lanes,
        stages: Sequence[Stage],
        manifest: Manifest,
        arena: Arena,
        allocator: OutputAllocator,
        *,
        fenced: bool = False,
    ) -> None:
        self.lanes = lanes
        self.fenced = fenced
        self.output = InFlight(allocator)
        self.fault: LanesFault | None = None  # the device failed: every call refused
        self._hot = [s for s in stages if s.lane is Lane.HOT]
        self._deferred = [s for s in stages if s.lane is Lane.DEFERRED]
        self._pipelined = manifest.pipelined
        self._arena = arena
        self._unpublished: list[Batch] = []  # fenced: the last step's, behind _fence
        self._fence: object = None
        self._published_ns = 0  # when the host last saw DEFERRED complete (0: not since)
        self._host = [0, 0, 0]  # t_host: steps timed, total ns, worst ns

    def advance(self, plan: Plan, started: int) -> list[Batch]:
        """Run HOT on the plan's hot rows; return the batches decoded this step."""
        if not self._pipelined:
            hot = self._hot_batch(plan, started)
            decoded = self.decode([hot] if hot is not None else [], publish=False)
        else:
            # A batch held under this very plan was made by the last step that ran it,
            # which took every other in-flight chunk of these rows; whatever could change
            # that since (attach, detach, arming, encodes) replaced the plan. Whole, it is
            # all there is.
            active = [r.index for r in plan.active]
            taken = self.output.take_newest(plan) or self.output.take(active)
            decoded = self.decode(taken, publish=False)
            hot = self._hot_batch(plan, started)
            if hot is not None:
                self.output.hold(hot, plan)
        if not self.fenced:
            return self._publish(decoded) if decoded else decoded
        self.published()  # the last step's frames, waited for after this step's HOT launch
        if decoded:
            self._unpublished, self._fence = decoded, self.lanes.mark(Lane.DEFERRED)
        return decoded

    def decode(self, batches: list[Batch], *, publish: bool = True) -> list[Batch]:
        """Issue DEFERRED for ``batches`` (each after its HOT marker), then publish
        (which also publishes a fenced step's frames: DEFERRED runs in order)."""
        for batch in batches:
            self.output.allocate(batch)
            self._issue(batch)
        if batches and publish:
            self._publish(batches)
        return batches

    def published(self) -> list[Batch]:
        """Fenced: wait for the last step's DEFERRED; return its batches, now written."""
        batches, self._unpublished = self._unpublished, []
        if batches:
            self.lanes.host_wait(self._fence)
            self._seen_published()
            self.lanes.handed_out(batches)
        self._fence = None
        return batches

    def _publish(self, batches: list[Batch]) -> list[Batch]:
        """Wait until every DEFERRED issued so far is done; hand ``batches`` out."""
        self.lanes.publish()
        self._seen_published()
        self.lanes.handed_out([*self._unpublished, *batches])
        self._unpublished, self._fence = [], None
        return batches

    def _seen_published(self) -> None:
        self._published_ns = time.perf_counter_ns()

    def host_share(self) -> HostShare:
        """t_host so far: the host's time from a publish to the next HOT launch."""
        steps, total, worst = self._host
        return HostShare(steps, total, worst)

    def decode_apart(self, batches: list[Batch], allocator: OutputAllocator) -> list[Batch]:
        """Decode ``batches`` into buffers of ``allocator``, not the engine's (their
        chunks leave in a suspended session's state, never in a step's results)."""
        for batch in batches:
            batch.out = allocator.allocate(batch)
            self._issue(batch)
        if batches:
            self._publish(batches)
        return batches

    def hold_restored(self, batch: Restored) -> None:
        """Hold chunks made before a suspend: the next step that takes their rows
        emits them (copied into the engine's buffers) as it emits any in flight."""
        self.output.hold(batch, None)

    def _issue(self, batch: Batch) -> None:
        self.lanes.wait(Lane.DEFERRED, batch.ready)
        whole = batch.source[0] if batch.source is not None else batch
        self.lanes.hand_over(whole.carry, Lane.DEFERRED)
        if batch.source is not None:  # its rows of HOT's carry, taken once HOT made it
            self.lanes.run(Lane.DEFERRED, batch.take_carry, whole)
        if isinstance(whole, Restored):  # decoded before the suspend: copied, not decoded
            self.lanes.run(Lane.DEFERRED, Restored.write, batch)
            return
        for stage in self._deferred:
            self.lanes.run(Lane.DEFERRED, stage.fn, batch)

    def _hot_batch(self, plan: Plan, started: int) -> Batch | None:
        """Issue HOT for the plan's hot rows (None when none is hot)."""
        if not plan.hot:
            return None
        arena = self._arena
        if plan.conditioning_gen != arena.conditioning_gen:
            plan.conditioning = [r.conditioning for r in plan.hot]
            plan.conditioning_gen = arena.conditioning_gen
        ages = arena.age[plan.hot_at]
        chunks: list[int] = ages.tolist()
        hot = Batch(plan.hot_index, plan.hot_sessions, chunks, plan.conditioning)
        hot.generated_ns, hot.chunk_words = started, ages  # (ages: a copy, never changed)
        if self._published_ns:  # t_host: since the host saw the last DEFERRED complete
            spent = time.perf_counter_ns() - self._published_ns
            self._published_ns = 0
            host = self._host
            host[0] += 1
            host[1] += spent
            host[2] = max(host[2], spent)
        for stage in self._hot:
            self.lanes.run(Lane.HOT, stage.fn, hot)
        hot.ready = self.lanes.mark(Lane.HOT)
        arena.age[plan.hot_at] = ages + 1
        return hot

    def fail(self) -> None:
        """The failure boundary: drain every lane, discard all in-flight output."""
        try:
            self.drain(quiet=True)
        finally:
            self._unpublished, self._fence = [], None  # drained: written, or the device failed
            self.output.discard()

    def drain(self, *, quiet: bool = False) -> None:
        """Wait for every lane; a device that stays failed ends the engine (EngineFault).
        ``quiet``: another failure is in hand, so one the lanes report once is not raised."""
        try:
            self.lanes.drain()
        except LanesFault as fault:
            self.fault = fault
            self.output.discard()
            why = f"{fault.__cause__ or fault}; nothing more can run on it (start a new process)"
            raise EngineFault(f"the engine's device failed and stays failed: {why}") from fault
        except Exception:
            if not quiet:
                raise

    def close(self) -> None:
        """Wait for every lane and release them; EngineFault if the device failed
        (and that was not yet said)."""
        try:
            self.lanes.close()
        except LanesFault as fault:
            if self.fault is None:  # first seen now: say it as everywhere else
                self.fault = fault
                raise EngineFault(f"the engine's device failed: {fault}") from fault


class Restored(Batch):
    """Chunks a resumed session made before its suspend, decoded then (its state's
    ``pending``): their frames are the batch's carry, and DEFERRED copies them."""

    @staticmethod
    def write(batch: Batch) -> None:
        for out, frame in zip(batch.out, batch.carry["frames"], strict=True):
            out[...] = frame


@dataclass(frozen=True)
class HostShare:
    """The host's share of the step period (t_host): the time from a step's publish
    wait returning (its DEFERRED seen complete) to the next step's HOT launch. Not
    fenced, the device idles through it, so a step period is at least DEFERRED's
    time plus this; fenced, a decode is queued on the device meanwhile."""

    steps: int  # intervals timed
    total_ns: int
    worst_ns: int

    @property
    def mean_ms(self) -> float:
        return self.total_ns / self.steps / 1e6 if self.steps else 0.0
