"""ComposedEngine: the batching machinery, written once, that turns a StageModel
into a lockstep cohort.

A model is a :class:`~rte.stages.StageModel`: a manifest, lane-tagged
:class:`Stage` s, and ``seed``/``detach``. The engine owns everything else:

* **Arena.** ``max_sessions`` fixed rows (:mod:`rte.arena`); attach takes the lowest free.
* **Arming.** New rows wait as pending until ``seed_ready(pending)``; then
  ``seed`` runs once for the whole pending set on HOT, at a step boundary.
  Who holds a row, and every way in and out of one, is :mod:`rte.membership`.
* **Pipelining.** With ``pipeline_depth_chunks == 2``, DEFERRED decodes chunk
  N-1 while HOT makes chunk N (:mod:`rte.pipeline`): the first step emits
  nothing. In-flight output is held per HOT batch (:class:`~rte.output.InFlight`),
  so a detach removes only its own row and a due subset decodes only its own rows.
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
* **A session's state.** ``suspend`` takes a session out at a chunk boundary
  as a :class:`~rte.state.SessionState` (its row freed) and ``resume`` puts it
  back, in this engine or another, its frames those of a twin never suspended
  (:mod:`rte.suspension`), for a model that exports its rows (``can_suspend``).
* **Leaving stalls nobody.** A detach waits for no lane: the model forgets the
  row on HOT, after the HOT work queued for it (only an encode of that row still
  under way is waited for: it rewrites the row).

Every method is called from one thread, the stepping thread.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rte.arena import Arena
from rte.contract import Action, Manifest, StepResult
from rte.encodes import Encodes
from rte.errors import EngineClosedError, EngineFault, RequestError
from rte.lanes import Lane, Lanes, make_lanes
from rte.membership import Membership
from rte.outcomes import emitted_by_row, report_failed, step_results
from rte.output import HeapAllocator, OutputAllocator
from rte.pipeline import HostShare, Pipeline
from rte.stages import StageModel, check_conditioning, check_stages
from rte.state import SessionState
from rte.suspension import Suspension


class ComposedEngine:
    """A Level-1 engine over a :class:`StageModel`.

    Args:
        model: the model.
        midrun_attach: when False, attach raises AdmissionError while any session is seeded.
        lanes: ``"auto"`` (CUDA streams for a model whose ``device`` is CUDA),
            ``"cpu"``, ``"cuda"``, ``"sim"``, or a :class:`Lanes` instance.
        allocator: where chunks are written; default :class:`HeapAllocator`.
        publish: ``"wait"``: a step returns once its frames are written. ``"fenced"``:
            it returns before (the device decodes while the host is between steps);
            its frames are written once the next step or :meth:`wait_published`
            returns, and only then may they be read or handed on.
        lazy_results: a step whose every due session emitted answers with a
            :class:`~rte.output.BatchResults` (each result made when looked at)
            instead of a list: for a host that delivers the chunks from its
            allocator's record of them (the daemon), never from the results.
    """

    def __init__(
        self,
        model: StageModel,
        *,
        midrun_attach: bool = True,
        lanes: str | Lanes = "auto",
        allocator: OutputAllocator | None = None,
        publish: str = "wait",
        lazy_results: bool = False,
    ) -> None:
        if publish not in ("wait", "fenced"):
            raise ValueError(f"publish must be 'wait' or 'fenced', not {publish!r}")
        self._model = model
        self._manifest = model.manifest()
        stages = tuple(model.stages())
        check_stages(model, stages)
        self._encode = [s for s in stages if s.lane is Lane.ENCODE]
        self._heavy = model.heavy_keys()
        self._keys = model.conditioning_keys()
        device = str(getattr(model, "device", "cpu"))
        self.lanes = lanes if isinstance(lanes, Lanes) else make_lanes(lanes, device)
        allocator = allocator or self.lanes.output_allocator(self._manifest)
        self._arena = Arena(self._manifest.max_sessions)
        self._pipeline = Pipeline(
            self.lanes,
            stages,
            self._manifest,
            self._arena,
            allocator or HeapAllocator(self._manifest),
            fenced=publish == "fenced",
        )
        self._lazy = lazy_results
        self._quiet = True  # no row pending, encoding or with a heavy change staged
        self._closed = False
        self._encodes = Encodes(self.lanes, self._encode, self._arena.batch)
        self._membership = Membership(
            model,
            self.lanes,
            self._arena,
            self._pipeline,
            self._encodes,
            midrun_attach=midrun_attach,
        )
        self._suspension = Suspension(model, self.lanes, self._arena, self._pipeline)

    # -- Level 1 ----------------------------------------------------------

    def manifest(self) -> Manifest:
        return self._manifest

    def attach(self, session: str, conditioning: Mapping[str, Any] | None = None) -> None:
        self._check_open()
        arena = self._arena
        if session in arena.by_session:
            return
        free = self._membership.admit(session)
        check_conditioning(self._model, self._keys, conditioning or {})
        arena.failed.pop(session, None)  # failed and not detached: it starts again
        arena.take(free, session, copy.deepcopy(dict(conditioning or {})))
        self._quiet = False

    def step(
        self, due: Iterable[str], actions: Mapping[str, Action] | None = None
    ) -> Sequence[StepResult]:
        self._check_open()
        arena = self._arena
        key = tuple(due)
        rows = arena.due_rows(key)
        rejected = self._apply_all(actions) if actions else {}
        started = time.monotonic_ns()
        try:
            if not self._quiet:
                self._membership.arm()
                self._membership.settle_encodes()
                if arena.failed:  # a row whose own seed or encode failed this step left
                    rows = [r for r in rows if r.session not in arena.failed]
                if self._encodes.start(rows):
                    arena.gen += 1
                self._quiet = not any(not r.armed or r.encoding or r.staged for r in arena.live())
            plan = arena.plan(key, rows, rejected)
            decoded = self._pipeline.advance(plan, started)
        except BaseException:
            self._pipeline.fail()
            raise
        self._pipeline.output.emitted()
        results = step_results(plan, decoded, rejected, arena.age, started, self._lazy)
        if arena.failed:
            return report_failed(arena.failed, key, results, started)
        return results

    def finalize(self, sessions: Iterable[str] | None = None) -> list[StepResult]:
        self._check_open()
        pipeline = self._pipeline
        rows = self._arena.resolve(sessions) if sessions is not None else self._arena.live()
        try:
            decoded = pipeline.decode(pipeline.output.take([r.index for r in rows]))
        except BaseException:
            pipeline.fail()
            raise
        pipeline.output.emitted()
        emitted = emitted_by_row(decoded, time.monotonic_ns())
        return [emitted[r.index] for r in rows if r.index in emitted]

    def detach(self, session: str) -> None:
        self._check_open()
        if self._arena.failed.pop(session, None) is not None:  # its row went when it failed
            self._arena.gen += 1  # a plan that named it is stale: it is unknown from now on
            return
        self._membership.leave(self._arena.lookup(session))

    # -- a session's state out and back in (rte.suspension) ------------------

    @property
    def can_suspend(self) -> bool:
        """Whether the model exports its rows' state (else ``suspend`` raises StateError)."""
        return self._suspension.identity is not None

    def suspend(self, session: str) -> SessionState:
        """Take ``session`` out at this chunk boundary: its row is freed and its state
        returned (the chunk in flight for it decoded into the state, its encode under
        way waited for). StateError when the model cannot (``can_suspend``), and the
        session stays attached; UnknownSessionError for a session not attached."""
        self._check_open()
        row = self._arena.lookup(session)
        self._suspension.check(session)
        self._membership.settle_encodes(row)  # its encode under way, waited for
        self._arena.lookup(session)  # (its own failure: it left, saying why)
        state = self._suspension.take_out(row)
        self._membership.free(row)
        return state

    def suspend_many(self, sessions: list[str]) -> dict[str, SessionState]:
        """:meth:`suspend` of several sessions at once (one export call, one decode of
        their chunks in flight): a checkpoint of many costs about one's. On an error
        none is taken out (but for a failed decode, as ``suspend``)."""
        self._check_open()
        rows = [self._arena.lookup(session) for session in sessions]
        for row in rows:
            self._suspension.check(row.session)
            self._membership.settle_encodes(row)
        rows = [self._arena.lookup(session) for session in sessions]  # (their own failures)
        states = self._suspension.take_out_many(rows)
        for row in rows:
            self._membership.free(row)
        return {state.session: state for state in states}

    def resume(self, session: str, state: SessionState) -> None:
        """Give ``session`` a row again as ``state`` left it: it goes on at its next
        chunk index, its frames those of a session never suspended. AdmissionError
        when no row is free; StateError for a state of another model, configuration
        or version (or another session's); RequestError if it is attached."""
        self._check_open()
        if session in self._arena.by_session:
            raise RequestError(
                f"session {session!r} cannot resume: it is attached to this engine; "
                "suspend or detach it first"
            )
        free = self._membership.admit(session)
        self._suspension.put_back(free, session, state)
        self._arena.failed.pop(session, None)
        self._quiet = False

    def check_action(self, session: str, action: Action) -> None:
        """Raise now what ``step`` would refuse this action for (unknown session,
        malformed conditioning), so a host can answer its sender at once."""
        self._arena.lookup(session)
        check_conditioning(self._model, self._keys, action.conditioning)

    # -- introspection ----------------------------------------------------

    def sessions(self) -> dict[str, int]:
        """Attached sessions and the row each holds."""
        return {s: r.index for s, r in self._arena.by_session.items()}

    def age(self, session: str) -> int:
        """Chunks the session has generated (emitted or in flight)."""
        return int(self._arena.age[self._arena.lookup(session).index])

    def host_share(self) -> HostShare:
        """t_host: the host's time from a step's publish to the next step's HOT launch."""
        return self._pipeline.host_share()

    def wait_published(self) -> None:
        """Fenced publishing: block until the frames the last step returned are written."""
        self._check_open()
        try:
            self._pipeline.published()
        except BaseException:
            self._pipeline.fail()
            raise

    def close(self) -> None:
        """Wait for every lane and refuse further calls. Sessions are not detached."""
        if self._closed:
            return
        self._closed = True
        self._pipeline.close()

    def __enter__(self) -> ComposedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- actions ----------------------------------------------------------------

    def _apply_all(self, actions: Mapping[str, Action]) -> dict[str, str]:
        """Apply every well-formed action; return the refused ones (each for its own
        session only) with why: they sit this step out."""
        arena = self._arena
        rows = [(arena.lookup(s), a) for s, a in actions.items() if s not in arena.failed]
        rejected = {}
        for row, action in rows:
            try:
                check_conditioning(self._model, self._keys, action.conditioning)
            except ValueError as exc:
                rejected[row.session] = f"action refused: {exc}"
                continue
            if row.apply(action.conditioning, self._heavy, self._model.heavy_equal):
                self._quiet = False
            arena.conditioning_gen += 1
        return rejected

    def _check_open(self) -> None:
        fault = self._pipeline.fault
        if fault is not None:
            raise EngineFault(f"the engine's device failed: {fault.__cause__ or fault}")
        if self._closed:
            raise EngineClosedError("this engine was closed; build a new one")
