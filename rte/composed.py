"""ComposedEngine: the batching machinery, written once, that turns a StageModel
into a lockstep cohort.

A model is a :class:`~rte.stages.StageModel`: a manifest, an ordered list of lane-tagged
:class:`Stage` s, and ``seed``/``detach``. The engine owns everything else:

* **Arena.** ``max_sessions`` fixed rows; attach takes the lowest free row.
* **Arming.** New rows wait as pending until ``seed_ready(pending)``; then
  ``seed`` runs once for the whole pending set on the HOT lane, at a step
  boundary. Residents keep their in-flight output across a join.
* **Pipelining.** With ``pipeline_depth_chunks == 2``, DEFERRED decodes chunk
  N-1 while HOT makes chunk N: the first step emits nothing. The in-flight
  output is held per row, as (HOT batch, position), so a detach removes only
  its own row and a due subset decodes only its own rows.
* **Bystander isolation.** A changed heavy key sends its row through ENCODE
  (asynchronous); the row sits out until the encode completes, then rejoins
  with the new value. Other rows keep advancing meanwhile.
* **Failure boundary.** A failure in seed or any stage propagates only after
  every lane is drained, and the in-flight output is discarded: nothing is ever
  emitted stale or twice. Chunk indices stay strictly increasing per session; a
  gap marks chunks that were discarded. A failed detach drains the lanes and
  leaves its session attached (to retry); other rows keep their output.

Every method is called from one thread, the stepping thread.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rte.contract import Action, Manifest, ResultKind, StepResult, Timing
from rte.errors import AdmissionError, EngineClosedError, UnknownSessionError
from rte.lanes import Completion, Lane, Lanes, make_lanes
from rte.stages import Batch, HeapAllocator, OutputAllocator, StageModel


@dataclass
class _Encode:
    completion: Completion
    values: dict[str, Any]


@dataclass
class _Row:
    index: int
    session: str
    conditioning: dict[str, Any]
    armed: bool = False
    age: int = 0  # chunks generated so far
    inflight: tuple[Batch, int] | None = None  # generated, not yet decoded
    encoding: _Encode | None = None
    staged: dict[str, Any] = field(default_factory=dict)  # heavy changes not yet encoding


_MISSING = object()


class ComposedEngine:
    """A Level-1 engine over a :class:`StageModel`.

    Args:
        model: the model.
        midrun_attach: when False, attach raises AdmissionError while any
            session is seeded; the arena must drain before new arrivals.
        lanes: ``"auto"`` (CUDA streams when torch with CUDA is already
            imported), ``"cpu"``, ``"cuda"``, or a :class:`Lanes` instance.
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
        self.lanes = lanes if isinstance(lanes, Lanes) else make_lanes(lanes)
        self._allocator: OutputAllocator = allocator or HeapAllocator(self._manifest)
        self._rows: list[_Row | None] = [None] * self._manifest.max_sessions
        self._by_session: dict[str, _Row] = {}
        self._unemitted: list[tuple[str, int, np.ndarray[Any, Any]]] = []
        self._closed = False

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
            n = len(self._rows)
            raise AdmissionError(
                f"session {session!r} refused: all {n} rows are in use; "
                "detach a session or retry later"
            )
        self._check_conditioning(conditioning or {})
        row = _Row(free, session, copy.deepcopy(dict(conditioning or {})))
        self._rows[free] = row
        self._by_session[session] = row

    def step(
        self, due: Iterable[str], actions: Mapping[str, Action] | None = None
    ) -> list[StepResult]:
        self._check_open()
        rows = self._resolve(due)
        rejected = self._apply_all(actions or {})
        started = time.monotonic_ns()
        try:
            self._arm()
            self._settle_encodes()
            self._start_encodes(rows)
            emitted = self._advance([r for r in rows if r.session not in rejected], started)
        except BaseException:
            self._fail()
            raise
        self._unemitted.clear()
        return self._results(rows, emitted, rejected, started)

    def finalize(self, sessions: Iterable[str] | None = None) -> list[StepResult]:
        self._check_open()
        rows = self._resolve(sessions) if sessions is not None else self._live()
        flight = [r for r in rows if r.inflight is not None]
        try:
            emitted = self._decode(flight)
        except BaseException:
            self._fail()
            raise
        self._unemitted.clear()
        now = time.monotonic_ns()
        return [self._chunk_result(r, emitted[r.index], now) for r in flight]

    def detach(self, session: str) -> None:
        self._check_open()
        row = self._lookup(session)
        self.lanes.drain()
        if row.armed:
            try:
                self.lanes.run(Lane.HOT, self._model.detach, row.index)
            except BaseException:
                # The session stays attached (the model may still hold it); the
                # other rows' in-flight chunks are sound and are kept.
                self.lanes.drain()
                raise
        del self._by_session[session]
        self._rows[row.index] = None

    def check_action(self, session: str, action: Action) -> None:
        """Raise now what ``step`` would refuse this action for (unknown session,
        malformed conditioning), so a host can answer its sender at once."""
        self._lookup(session)
        self._check_conditioning(action.conditioning)

    # -- introspection ----------------------------------------------------

    def sessions(self) -> dict[str, int]:
        """Attached sessions and the row each holds."""
        return {s: r.index for s, r in self._by_session.items()}

    def age(self, session: str) -> int:
        """Chunks the session has generated (emitted or in flight)."""
        return self._lookup(session).age

    def close(self) -> None:
        """Wait for every lane and refuse further calls. Sessions are not detached."""
        if not self._closed:
            self._closed = True
            self.lanes.close()

    def __enter__(self) -> ComposedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the step body ----------------------------------------------------

    def _arm(self) -> None:
        pending = [r for r in self._live() if not r.armed]
        if pending and self._model.seed_ready([r.index for r in pending]):
            batch = self._batch(pending, [r.conditioning for r in pending], 0)
            self.lanes.run(Lane.HOT, self._model.seed, batch)
            for r in pending:
                r.armed = True

    def _settle_encodes(self) -> None:
        failure: BaseException | None = None
        for r in self._live():
            encode = r.encoding
            if encode is None or not encode.completion.done():
                continue
            r.encoding = None
            try:
                encode.completion.result()
            except Exception as exc:  # the change is dropped; the row keeps its old value
                failure = failure or exc
                continue
            r.conditioning.update(encode.values)
        if failure is not None:
            raise failure

    def _start_encodes(self, rows: list[_Row]) -> None:
        starting = [r for r in rows if r.armed and r.staged and r.encoding is None]
        if not starting:
            return
        batch = self._batch(starting, [dict(r.staged) for r in starting], 0)
        completion = self.lanes.submit_encode(self._run_encode, batch)
        for r in starting:
            r.encoding = _Encode(completion, r.staged)
            r.staged = {}

    def _run_encode(self, batch: Batch) -> None:
        for stage in self._encode:
            stage.fn(batch)

    def _advance(self, rows: list[_Row], started: int) -> dict[int, tuple[int, Any, int]]:
        hot_rows = [r for r in rows if r.armed and r.encoding is None]
        hot = None
        if hot_rows:
            hot = self._batch(hot_rows, [dict(r.conditioning) for r in hot_rows], started)
            for stage in self._hot:
                self.lanes.run(Lane.HOT, stage.fn, hot)
            hot.ready = self.lanes.mark(Lane.HOT)
            for r in hot_rows:
                r.age += 1
        if not self._manifest.pipelined:
            return self._decode_batches([hot] if hot is not None else [])
        emitted = self._decode([r for r in rows if r.inflight is not None])
        if hot is not None:
            for position, r in enumerate(hot_rows):
                r.inflight = (hot, position)
        return emitted

    def _decode(self, rows: list[_Row]) -> dict[int, tuple[int, Any, int]]:
        """Decode the in-flight chunks of ``rows``, grouped by the HOT batch that made them."""
        groups: dict[int, tuple[Batch, list[int]]] = {}
        for r in rows:
            assert r.inflight is not None
            batch, position = r.inflight
            groups.setdefault(id(batch), (batch, []))[1].append(position)
        emitted = self._decode_batches([b.subset(sorted(p)) for b, p in groups.values()])
        for r in rows:
            r.inflight = None
        return emitted

    def _decode_batches(self, batches: list[Batch]) -> dict[int, tuple[int, Any, int]]:
        emitted: dict[int, tuple[int, Any, int]] = {}
        for batch in batches:
            batch.out = []
            for session, chunk in zip(batch.sessions, batch.chunks, strict=True):
                buffer = self._allocator.allocate(session, chunk)
                self._unemitted.append((session, chunk, buffer))
                batch.out.append(buffer)
            self.lanes.wait(Lane.DEFERRED, batch.ready)
            self.lanes.hand_over(batch.carry, Lane.DEFERRED)
            for stage in self._deferred:
                self.lanes.run(Lane.DEFERRED, stage.fn, batch)
            for i, row in enumerate(batch.rows):
                emitted[row] = (batch.chunks[i], batch.out[i], batch.generated_ns)
        if batches:
            self.lanes.publish()
        return emitted

    def _fail(self) -> None:
        """The failure boundary: drain every lane, discard all in-flight output."""
        self.lanes.drain()
        for r in self._live():
            r.inflight = None
        for session, chunk, buffer in self._unemitted:
            self._allocator.discard(session, chunk, buffer)
        self._unemitted.clear()

    # -- helpers ----------------------------------------------------------

    def _apply_all(self, actions: Mapping[str, Action]) -> dict[str, str]:
        """Apply every well-formed action; a malformed one is refused for its session only.

        Returns the refused sessions with the reason; they sit this step out.
        """
        rows = [(self._lookup(s), a) for s, a in actions.items()]
        rejected = {}
        for row, action in rows:
            try:
                self._check_conditioning(action.conditioning)
            except ValueError as exc:
                rejected[row.session] = f"action refused: {exc}"
                continue
            self._apply(row, action)
        return rejected

    def _apply(self, row: _Row, action: Action) -> None:
        for key, value in action.conditioning.items():
            if key not in self._heavy or not row.armed:
                row.conditioning[key] = value
                continue
            # Compare with the value the row will hold once its queued work is done.
            effective = row.conditioning.get(key, _MISSING)
            if row.encoding is not None and key in row.encoding.values:
                effective = row.encoding.values[key]
            if effective is not _MISSING and self._model.heavy_equal(key, effective, value):
                row.staged.pop(key, None)
            else:
                row.staged[key] = copy.deepcopy(value)

    def _results(
        self,
        rows: list[_Row],
        emitted: dict[int, tuple[int, Any, int]],
        rejected: dict[str, str],
        started: int,
    ) -> list[StepResult]:
        now = time.monotonic_ns()
        results = []
        for r in rows:
            if r.index in emitted:
                results.append(self._chunk_result(r, emitted[r.index], now))
                continue
            error = rejected.get(r.session)
            if error is not None:
                kind, chunk = ResultKind.ERROR, -1
            elif not r.armed:
                kind, chunk = ResultKind.PENDING, r.age
            elif r.encoding is not None:
                kind, chunk = ResultKind.ENCODING, r.age
            else:
                kind, chunk = ResultKind.WARMUP, r.age
            results.append(StepResult(r.session, chunk, kind, None, Timing(started, now), error))
        return results

    @staticmethod
    def _chunk_result(row: _Row, emitted: tuple[int, Any, int], now: int) -> StepResult:
        chunk, latent, generated = emitted
        return StepResult(row.session, chunk, ResultKind.CHUNK, latent, Timing(generated, now))

    @staticmethod
    def _batch(rows: list[_Row], conditioning: list[dict[str, Any]], started: int) -> Batch:
        return Batch(
            rows=[r.index for r in rows],
            sessions=[r.session for r in rows],
            chunks=[r.age for r in rows],
            conditioning=conditioning,
            generated_ns=started,
        )

    def _check_conditioning(self, conditioning: Mapping[str, Any]) -> None:
        """ValueError for a key the model does not take, or a value it refuses."""
        if self._keys is not None and not self._keys.issuperset(conditioning):
            unknown = ", ".join(repr(k) for k in sorted(set(conditioning) - self._keys))
            raise ValueError(
                f"unknown conditioning key {unknown}: {self._manifest.model or 'this model'} "
                f"takes {', '.join(sorted(self._keys))}"
            )
        self._model.check_conditioning(conditioning)

    def _live(self) -> list[_Row]:
        return [r for r in self._rows if r is not None]

    def _lookup(self, session: str) -> _Row:
        row = self._by_session.get(session)
        if row is None:
            raise UnknownSessionError(f"session {session!r} is not attached to this engine")
        return row

    def _resolve(self, sessions: Iterable[str]) -> list[_Row]:
        rows = [self._lookup(s) for s in dict.fromkeys(sessions)]
        return rows

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("this engine was closed; build a new one")
