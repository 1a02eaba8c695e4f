"""ComposedEngine: the batching machinery, written once, that turns a StageModel
into a lockstep cohort.

A model is a :class:`~rte.stages.StageModel`: a manifest, lane-tagged
:class:`Stage` s, and ``seed``/``detach``. The engine owns everything else:

* **Arena.** ``max_sessions`` fixed rows (:mod:`rte.arena`); attach takes the lowest free.
* **Arming.** New rows wait as pending until ``seed_ready(pending)``; then
  ``seed`` runs once for the whole pending set on HOT, at a step boundary.
* **Pipelining.** With ``pipeline_depth_chunks == 2``, DEFERRED decodes chunk
  N-1 while HOT makes chunk N: the first step emits nothing. In-flight output is
  held per HOT batch (:class:`~rte.output.InFlight`), so a detach removes only
  its own row and a due subset decodes only its own rows.
* **The common step.** A due list resolves to a cached plan; the same due list
  again decodes last step's HOT batch whole: no per-row bookkeeping.
* **Bystander isolation.** A changed heavy key sends its row through ENCODE
  (asynchronous, :mod:`rte.encodes`); the row sits out until the encode
  completes, then rejoins with the new value. Other rows keep advancing meanwhile.
* **A session's own failure.** A seed or encode that fails for one session
  (each row of a failed batch is retried alone, to find whose) detaches it
  alone, its row freed; it is FAILED until detached (:mod:`rte.outcomes`).
* **Failure boundary.** Any other failure (a stage, a detach) propagates only
  after every lane is drained, and the in-flight output is discarded: nothing is
  ever emitted stale or twice; a gap in a session's chunk indices marks
  discarded chunks. A failed detach leaves its session attached (to retry). A
  device that stays failed (a sticky CUDA error) ends the engine: :class:`EngineFault`.

Every method is called from one thread, the stepping thread.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rte.arena import Plan, Row
from rte.contract import Action, Manifest, StepResult
from rte.encodes import Encodes
from rte.errors import AdmissionError, EngineClosedError, EngineFault, UnknownSessionError
from rte.lanes import Lane, Lanes, LanesFault, make_lanes
from rte.outcomes import emitted_by_row, report_failed, step_results
from rte.output import HeapAllocator, InFlight, OutputAllocator
from rte.stages import Batch, StageModel, check_conditioning, check_session_id

_MISSING = object()


class ComposedEngine:
    """A Level-1 engine over a :class:`StageModel`.

    Args:
        model: the model.
        midrun_attach: when False, attach raises AdmissionError while any session is seeded.
        lanes: ``"auto"`` (CUDA streams for a model whose ``device`` is CUDA),
            ``"cpu"``, ``"cuda"``, ``"sim"``, or a :class:`Lanes` instance.
        allocator: where chunks are written; default :class:`HeapAllocator`.
    """

    def __init__(
        self,
        model: StageModel,
        *,
        midrun_attach: bool = True,
        lanes: str | Lanes = "auto",
        allocator: OutputAllocator | None = None,
    ) -> None:
        self._model = model
        self._manifest = model.manifest()
        stages = tuple(model.stages())
        self._hot = [s for s in stages if s.lane is Lane.HOT]
        self._deferred = [s for s in stages if s.lane is Lane.DEFERRED]
        self._encode = [s for s in stages if s.lane is Lane.ENCODE]
        self._heavy = model.heavy_keys()
        self._keys = model.conditioning_keys()
        if not self._hot or not self._deferred:
            raise ValueError(
                f"{type(model).__name__} needs at least one HOT stage (makes the latent) "
                "and one DEFERRED stage (writes each chunk into its output buffer)"
            )
        if self._heavy and not self._encode:
            raise ValueError(
                f"{type(model).__name__} declares heavy keys {sorted(self._heavy)} "
                "but has no ENCODE stage to encode them"
            )
        self._midrun_attach = midrun_attach
        device = str(getattr(model, "device", "cpu"))
        self.lanes = lanes if isinstance(lanes, Lanes) else make_lanes(lanes, device)
        allocator = allocator or self.lanes.output_allocator(self._manifest)
        self._output = InFlight(allocator or HeapAllocator(self._manifest))
        self._rows: list[Row | None] = [None] * self._manifest.max_sessions
        self._age = np.zeros(self._manifest.max_sessions, np.int64)  # chunks generated, per row
        self._by_session: dict[str, Row] = {}
        self._quiet = True  # no row pending, encoding or with a heavy change staged
        self._gen = 0  # bumped by attach, detach, arming and encodes: a cached plan is stale
        self._conditioning_gen = 0  # bumped by every change of a row's conditioning
        self._plan: Plan | None = None
        self._closed = False
        self._fault: LanesFault | None = None  # the device failed: every call refused
        self._failed: dict[str, str] = {}  # detached by their own failure, not yet told: why
        self._encodes = Encodes(self.lanes, self._encode, self._batch)

    # -- Level 1 ----------------------------------------------------------

    def manifest(self) -> Manifest:
        return self._manifest

    def attach(self, session: str, conditioning: Mapping[str, Any] | None = None) -> None:
        self._check_open()
        if session in self._by_session:
            return
        if not self._midrun_attach and any(r.armed for r in self._by_session.values()):
            raise AdmissionError(
                f"session {session!r} refused: this engine admits no arrivals while a cohort "
                "runs (midrun_attach=False); retry once every session has detached"
            )
        free = next((i for i, r in enumerate(self._rows) if r is None), None)
        if free is None:
            raise AdmissionError(
                f"session {session!r} refused: all {len(self._rows)} rows are in use; "
                "detach a session or retry later"
            )
        check_session_id(session)
        check_conditioning(self._model, self._keys, conditioning or {})
        self._failed.pop(session, None)  # failed and not detached: it starts again
        row = Row(free, session, copy.deepcopy(dict(conditioning or {})))
        self._rows[free] = row
        self._by_session[session] = row
        self._age[free] = 0
        self._quiet = False
        self._gen += 1

    def step(
        self, due: Iterable[str], actions: Mapping[str, Action] | None = None
    ) -> list[StepResult]:
        self._check_open()
        key = tuple(due)
        plan = self._plan
        if plan is not None and plan.gen == self._gen and plan.due == key:
            rows = plan.rows
        else:
            rows = self._resolve(key)
        rejected = self._apply_all(actions) if actions else {}
        started = time.monotonic_ns()
        try:
            if not self._quiet:
                self._arm()
                self._settle_encodes()
                if self._failed:  # a row whose own seed or encode failed this step left
                    rows = [r for r in rows if r.session not in self._failed]
                if self._encodes.start(rows):
                    self._gen += 1
                self._quiet = not any(not r.armed or r.encoding or r.staged for r in self._live())
            plan = self._plan_for(key, rows, rejected)
            decoded = self._advance(plan, started)
        except BaseException:
            self._fail()
            raise
        self._output.emitted()
        results = step_results(plan, decoded, rejected, self._age, started)
        if self._failed:
            return report_failed(self._failed, key, results, started)
        return results

    def finalize(self, sessions: Iterable[str] | None = None) -> list[StepResult]:
        self._check_open()
        rows = self._resolve(sessions) if sessions is not None else self._live()
        try:
            decoded = self._decode_batches(self._output.take([r.index for r in rows]))
        except BaseException:
            self._fail()
            raise
        self._output.emitted()
        emitted = emitted_by_row(decoded, time.monotonic_ns())
        return [emitted[r.index] for r in rows if r.index in emitted]

    def detach(self, session: str) -> None:
        self._check_open()
        if self._failed.pop(session, None) is not None:  # its row went when it failed
            self._gen += 1  # a plan that named it is stale: it is unknown from now on
            return
        row = self._lookup(session)
        if row.armed:
            # No lane is waited for: the model forgets the row on HOT, after the HOT
            # work queued for it; DEFERRED reads only batches' carries, never rows. Only
            # an encode under way rewrites the row: its host side must have issued it
            # (a rare wait, for that encode alone) before HOT may forget the row.
            if row.encoding is not None and not row.encoding.done():
                with contextlib.suppress(Exception):  # the row is leaving: its failure too
                    row.encoding.result()
            try:
                self.lanes.run(Lane.HOT, self._model.detach, row.index)
            except BaseException:
                # The session stays attached (the model may still hold it); the
                # other rows' in-flight chunks are sound and are kept.
                self._drain(quiet=True)
                raise
        self._free(row)

    def check_action(self, session: str, action: Action) -> None:
        """Raise now what ``step`` would refuse this action for (unknown session,
        malformed conditioning), so a host can answer its sender at once."""
        self._lookup(session)
        check_conditioning(self._model, self._keys, action.conditioning)

    # -- introspection ----------------------------------------------------

    def sessions(self) -> dict[str, int]:
        """Attached sessions and the row each holds."""
        return {s: r.index for s, r in self._by_session.items()}

    def age(self, session: str) -> int:
        """Chunks the session has generated (emitted or in flight)."""
        return int(self._age[self._lookup(session).index])

    def close(self) -> None:
        """Wait for every lane and refuse further calls. Sessions are not detached."""
        if self._closed:
            return
        self._closed = True
        try:
            self.lanes.close()
        except LanesFault as fault:
            if self._fault is None:  # first seen now: say it as everywhere else
                self._fault = fault
                raise EngineFault(f"the engine's device failed: {fault}") from fault

    def __enter__(self) -> ComposedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the step body ----------------------------------------------------

    def _arm(self) -> None:
        pending = [r for r in self._live() if not r.armed]
        if not pending or not self._model.seed_ready([r.index for r in pending]):
            return
        self._gen += 1
        failure = self._seed(pending)
        if failure is None:
            return
        # Whose was it? Seeded each alone, only a row whose own seed fails is failed.
        alone = [(r, self._seed([r])) for r in pending] if len(pending) > 1 else []
        for r, exc in alone or [(pending[0], failure)]:
            if exc is not None:
                self._drop_failed(r, f"its seed failed: {type(exc).__name__}: {exc}")

    def _seed(self, rows: list[Row]) -> Exception | None:
        """Seed ``rows`` on HOT and arm them; what the seed raised, if it failed."""
        try:
            conditioning = [r.conditioning for r in rows]
            self.lanes.run(Lane.HOT, self._model.seed, self._batch(rows, conditioning))
        except Exception as exc:
            return exc
        for r in rows:
            r.armed = True
        return None

    def _settle_encodes(self) -> None:
        settled, failed = self._encodes.settle(self._live())
        if settled:
            self._gen += 1
            self._conditioning_gen += 1
        for row, why in failed:
            self._drop_failed(row, why)

    def _drop_failed(self, row: Row, why: str) -> None:
        """Free ``row``, whose own seed or encode failed (FAILED until it is detached);
        an armed row the model forgets on HOT, after whatever ENCODE did to it."""
        if row.armed:
            self.lanes.wait(Lane.HOT, self.lanes.mark(Lane.ENCODE))
            self.lanes.run(Lane.HOT, self._model.detach, row.index)
        self._free(row)
        self._failed[row.session] = f"session {row.session!r} failed, its row freed: {why}"

    def _free(self, row: Row) -> None:
        del self._by_session[row.session]
        self._rows[row.index] = None
        self._output.drop(row.index)  # its in-flight chunk goes with it
        self._encodes.forget(row)
        self._gen += 1

    def _plan_for(self, due: tuple[str, ...], rows: list[Row], rejected: dict[str, str]) -> Plan:
        if rejected:  # a one-off: the refused rows sit this step out
            return Plan(due, -1, rows, [r for r in rows if r.session not in rejected])
        plan = self._plan
        if plan is None or plan.gen != self._gen or plan.due != due:
            plan = self._plan = Plan(due, self._gen, rows, rows)
        return plan

    def _advance(self, plan: Plan, started: int) -> list[Batch]:
        """Run HOT on the plan's hot rows; return the batches decoded this step.
        Pipelined, DEFERRED(N-1) is issued before HOT(N): on streams they overlap."""
        if not self._manifest.pipelined:
            hot = self._hot_batch(plan, started)
            return self._decode_batches([hot] if hot is not None else [])
        # A batch held under this very plan was made by the last step that ran it, which
        # took every other in-flight chunk of these rows; whatever could change that since
        # (attach, detach, arming, encodes) replaced the plan. Whole, it is all there is.
        taken = self._output.take_newest(plan) or self._output.take([r.index for r in plan.active])
        decoded = self._decode_batches(taken, publish=False)
        hot = self._hot_batch(plan, started)
        if hot is not None:
            self._output.hold(hot, plan)
        if decoded:
            self.lanes.publish()
        return decoded

    def _hot_batch(self, plan: Plan, started: int) -> Batch | None:
        """Issue HOT for the plan's hot rows (None when none is hot)."""
        if not plan.hot:
            return None
        if plan.conditioning_gen != self._conditioning_gen:
            plan.conditioning = [r.conditioning for r in plan.hot]
            plan.conditioning_gen = self._conditioning_gen
        ages = self._age[plan.hot_at]
        chunks: list[int] = ages.tolist()
        hot = Batch(plan.hot_index, plan.hot_sessions, chunks, plan.conditioning)
        hot.generated_ns = started
        for stage in self._hot:
            self.lanes.run(Lane.HOT, stage.fn, hot)
        hot.ready = self.lanes.mark(Lane.HOT)
        self._age[plan.hot_at] = ages + 1
        return hot

    def _decode_batches(self, batches: list[Batch], *, publish: bool = True) -> list[Batch]:
        for batch in batches:
            self._output.allocate(batch)
            self.lanes.wait(Lane.DEFERRED, batch.ready)
            whole = batch.source[0] if batch.source is not None else batch
            self.lanes.hand_over(whole.carry, Lane.DEFERRED)
            if batch.source is not None:  # its rows of HOT's carry, taken once HOT made it
                self.lanes.run(Lane.DEFERRED, batch.take_carry, whole)
            for stage in self._deferred:
                self.lanes.run(Lane.DEFERRED, stage.fn, batch)
        if batches and publish:
            self.lanes.publish()
        return batches

    def _fail(self) -> None:
        """The failure boundary: drain every lane, discard all in-flight output."""
        try:
            self._drain(quiet=True)
        finally:
            self._output.discard()

    def _drain(self, *, quiet: bool = False) -> None:
        """Wait for every lane; a device that stays failed ends the engine (EngineFault).
        ``quiet``: another failure is in hand, so one the lanes report once is not raised."""
        try:
            self.lanes.drain()
        except LanesFault as fault:
            self._fault = fault
            self._output.discard()
            why = f"{fault.__cause__ or fault}; nothing more can run on it (start a new process)"
            raise EngineFault(f"the engine's device failed and stays failed: {why}") from fault
        except Exception:
            if not quiet:
                raise

    # -- helpers ----------------------------------------------------------

    def _apply_all(self, actions: Mapping[str, Action]) -> dict[str, str]:
        """Apply every well-formed action; return the refused ones (each for its own
        session only) with why: they sit this step out."""
        rows = [(self._lookup(s), a) for s, a in actions.items() if s not in self._failed]
        rejected = {}
        for row, action in rows:
            try:
                check_conditioning(self._model, self._keys, action.conditioning)
            except ValueError as exc:
                rejected[row.session] = f"action refused: {exc}"
                continue
            self._apply(row, action)
        return rejected

    def _apply(self, row: Row, action: Action) -> None:
        conditioning = dict(row.conditioning)  # copy on write: batches hold the old one
        for key, value in action.conditioning.items():
            if key not in self._heavy or not row.armed:
                conditioning[key] = value
                continue
            # Compare with the value the row will hold once its queued work is done.
            effective = conditioning.get(key, _MISSING)
            if row.encoding is not None and key in row.encoding_values:
                effective = row.encoding_values[key]
            if effective is not _MISSING and self._model.heavy_equal(key, effective, value):
                row.staged.pop(key, None)
            else:
                row.staged[key] = copy.deepcopy(value)
                self._quiet = False
        row.conditioning = conditioning
        self._conditioning_gen += 1

    def _batch(self, rows: list[Row], conditioning: list[dict[str, Any]]) -> Batch:
        """A batch of ``rows`` for seed or ENCODE."""
        chunks = [int(self._age[r.index]) for r in rows]
        return Batch([r.index for r in rows], [r.session for r in rows], chunks, conditioning)

    def _live(self) -> list[Row]:
        return [r for r in self._rows if r is not None]

    def _lookup(self, session: str) -> Row:
        row = self._by_session.get(session)
        if row is None:
            why = f" ({self._failed[session]})" if session in self._failed else ""
            raise UnknownSessionError(f"session {session!r} is not attached to this engine{why}")
        return row

    def _resolve(self, sessions: Iterable[str]) -> list[Row]:
        unique: Iterable[str] = dict.fromkeys(sessions)
        if self._failed:  # detached when they failed: nothing to step or finalize
            unique = [s for s in unique if s not in self._failed]
        return [self._lookup(s) for s in unique]

    def _check_open(self) -> None:
        if self._fault is not None:
            raise EngineFault(f"the engine's device failed: {self._fault.__cause__ or self._fault}")
        if self._closed:
            raise EngineClosedError("this engine was closed; build a new one")
