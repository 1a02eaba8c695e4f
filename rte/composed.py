"""ComposedEngine: the batching machinery, written once, that turns a StageModel
into a lockstep cohort.

A model is a :class:`~rte.stages.StageModel`: a manifest, lane-tagged
:class:`Stage` s, and ``seed``/``detach``. The engine owns everything else:

* **Arena.** ``max_sessions`` fixed rows (:mod:`rte.arena`); attach takes the lowest free.
* **Arming.** New rows wait as pending until ``seed_ready(pending)``; then
  ``seed`` runs once for the whole pending set on HOT, at a step boundary.
* **Pipelining.** With ``pipeline_depth_chunks == 2``, DEFERRED decodes chunk
  N-1 while HOT makes chunk N: the first step emits nothing. In-flight output is
  held per HOT batch (:class:`~rte.stages.InFlight`), so a detach removes only
  its own row and a due subset decodes only its own rows.
* **The common step.** A due list resolves to a cached plan; the same due list
  again decodes last step's HOT batch whole: no per-row bookkeeping.
* **Bystander isolation.** A changed heavy key sends its row through ENCODE
  (asynchronous); the row sits out until the encode completes, then rejoins
  with the new value. Other rows keep advancing meanwhile.
* **Failure boundary.** A failure in seed or any stage propagates only after
  every lane is drained, and the in-flight output is discarded: nothing is ever
  emitted stale or twice; a gap in a session's chunk indices marks discarded
  chunks. A failed detach leaves its session attached (to retry). A device that
  stays failed (a sticky CUDA error) ends the engine: :class:`EngineFault`.

Every method is called from one thread, the stepping thread.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rte.arena import Plan, Row
from rte.contract import Action, Manifest, ResultKind, StepResult, Timing
from rte.errors import AdmissionError, EngineClosedError, EngineFault, UnknownSessionError
from rte.lanes import Lane, Lanes, LanesFault, make_lanes
from rte.stages import (
    Batch,
    HeapAllocator,
    InFlight,
    OutputAllocator,
    StageModel,
    check_conditioning,
    chunk_results,
)

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
        check_conditioning(self._model, self._keys, conditioning or {})
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
                self._start_encodes(rows)
                self._quiet = not any(not r.armed or r.encoding or r.staged for r in self._live())
            plan = self._plan_for(key, rows, rejected)
            decoded = self._advance(plan, started)
        except BaseException:
            self._fail()
            raise
        self._output.emitted()
        return self._results(plan, decoded, rejected, started)

    def finalize(self, sessions: Iterable[str] | None = None) -> list[StepResult]:
        self._check_open()
        rows = self._resolve(sessions) if sessions is not None else self._live()
        try:
            decoded = self._decode_batches(self._output.take([r.index for r in rows]))
        except BaseException:
            self._fail()
            raise
        self._output.emitted()
        emitted = self._emitted(decoded, time.monotonic_ns())
        return [emitted[r.index] for r in rows if r.index in emitted]

    def detach(self, session: str) -> None:
        self._check_open()
        row = self._lookup(session)
        self._drain()
        if row.armed:
            try:
                self.lanes.run(Lane.HOT, self._model.detach, row.index)
                self._drain()  # a detach that fails on the device fails here
            except BaseException:
                # The session stays attached (the model may still hold it); the
                # other rows' in-flight chunks are sound and are kept.
                self._drain(quiet=True)
                raise
        del self._by_session[session]
        self._rows[row.index] = None
        self._output.drop(row.index)  # its in-flight chunk goes with it
        self._gen += 1

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
        if pending and self._model.seed_ready([r.index for r in pending]):
            batch = self._batch(pending, [r.conditioning for r in pending])
            self.lanes.run(Lane.HOT, self._model.seed, batch)
            for r in pending:
                r.armed = True
            self._gen += 1

    def _settle_encodes(self) -> None:
        failure: BaseException | None = None
        for r in self._live():
            encode = r.encoding
            if encode is None or not encode.done():
                continue
            r.encoding, values, r.encoding_values = None, r.encoding_values, {}
            self._gen += 1
            try:
                encode.result()
            except Exception as exc:  # the change is dropped; the row keeps its old value
                failure = failure or exc
                continue
            r.conditioning = {**r.conditioning, **values}
            self._conditioning_gen += 1
        if failure is not None:
            raise failure

    def _start_encodes(self, rows: list[Row]) -> None:
        starting = [r for r in rows if r.armed and r.staged and r.encoding is None]
        if not starting:
            return
        batch = self._batch(starting, [dict(r.staged) for r in starting])
        completion = self.lanes.submit_encode(self._run_encode, batch)
        for r in starting:
            r.encoding, r.encoding_values, r.staged = completion, r.staged, {}
        self._gen += 1

    def _run_encode(self, batch: Batch) -> None:
        for stage in self._encode:
            stage.fn(batch)

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
        rows = [(self._lookup(s), a) for s, a in actions.items()]
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

    def _results(
        self, plan: Plan, decoded: list[Batch], rejected: dict[str, str], started: int
    ) -> list[StepResult]:
        now = time.monotonic_ns()
        if len(decoded) == 1 and decoded[0].rows is plan.index:  # every due row, in due order
            return chunk_results(decoded[0], now)
        emitted = self._emitted(decoded, now)
        timing = Timing(started, now)
        results = []
        for r in plan.rows:
            result = emitted.get(r.index)
            if result is None:
                error = rejected.get(r.session)
                if error is not None:
                    kind, chunk = ResultKind.ERROR, -1
                elif not r.armed:
                    kind, chunk = ResultKind.PENDING, int(self._age[r.index])
                elif r.encoding is not None:
                    kind, chunk = ResultKind.ENCODING, int(self._age[r.index])
                else:
                    kind, chunk = ResultKind.WARMUP, int(self._age[r.index])
                result = StepResult(r.session, chunk, kind, None, timing, error)
            results.append(result)
        return results

    @staticmethod
    def _emitted(decoded: list[Batch], now: int) -> dict[int, StepResult]:
        """The CHUNK result of every row of the decoded batches, by row."""
        return {r: c for b in decoded for r, c in zip(b.rows, chunk_results(b, now), strict=True)}

    def _batch(self, rows: list[Row], conditioning: list[dict[str, Any]]) -> Batch:
        """A batch of ``rows`` for seed or ENCODE."""
        chunks = [int(self._age[r.index]) for r in rows]
        return Batch([r.index for r in rows], [r.session for r in rows], chunks, conditioning)

    def _live(self) -> list[Row]:
        return [r for r in self._rows if r is not None]

    def _lookup(self, session: str) -> Row:
        row = self._by_session.get(session)
        if row is None:
            raise UnknownSessionError(f"session {session!r} is not attached to this engine")
        return row

    def _resolve(self, sessions: Iterable[str]) -> list[Row]:
        return [self._lookup(s) for s in dict.fromkeys(sessions)]

    def _check_open(self) -> None:
        if self._fault is not None:
            raise EngineFault(f"the engine's device failed: {self._fault.__cause__ or self._fault}")
        if self._closed:
            raise EngineClosedError("this engine was closed; build a new one")
