"""Suspend and resume: a session's row out of a ComposedEngine into a SessionState, and back.

:meth:`Suspension.take_out` runs at a chunk boundary, once the engine has
waited for the row's encode under way (if any) and settled it: the model
exports the row on HOT, after the HOT work queued for it (so the state is that
of the last chunk generated); the chunk DEFERRED still had in flight for it
(pipelined) is decoded on DEFERRED into buffers of the engine's kind but its
own, not the engine's allocator (so a slab lends nothing that a step would
not emit), and copied into the state; then the model forgets the row on HOT,
as on a detach. Nothing waits for the other rows' work: their in-flight chunks
stay where they are.

:meth:`Suspension.put_back` checks the state first (the model's identity, the
session, the chunk's dtype and shape, what the engine can hold), so a refused
state took no row and changed nothing; the model imports the row on HOT; the
row comes back at the state's next chunk index, seeded or pending, with its
staged heavy changes (encoded at the next step, as they would have been), and
the chunk it had in flight is held as a :class:`~rte.pipeline.Restored` batch,
which the next step that takes the row emits, exactly as the twin that was
never suspended emits it. See :mod:`rte.state` for the state itself.
"""

from __future__ import annotations

import copy
import time

import numpy as np

from rte.arena import Arena, Row
from rte.errors import StateError, WireError
from rte.lanes import Lane, Lanes
from rte.output import HeapAllocator
from rte.pipeline import Pipeline, Restored
from rte.protocol.values import encode_value
from rte.stages import Batch, StageModel, check_conditioning
from rte.state import ModelIdentity, RowState, SessionState


class Suspension:
    """Args:
    model: the engine's model (its ``state_identity``, ``export_rows``, ``import_rows``).
    lanes, arena, pipeline: the engine's.
    """

    def __init__(self, model: StageModel, lanes: Lanes, arena: Arena, pipeline: Pipeline) -> None:
        self._model = model
        self._manifest = model.manifest()
        self._keys = model.conditioning_keys()
        self.identity = model.state_identity()
        self._lanes = lanes
        self._arena = arena
        self._pipeline = pipeline
        self._apart = lanes.output_allocator(self._manifest) or HeapAllocator(self._manifest)

    def check(self, session: str) -> ModelIdentity:
        """The model's identity; StateError when it cannot export its rows."""
        if self.identity is None:
            raise StateError(
                f"session {session!r} cannot be suspended: {type(self._model).__name__} does "
                "not export its rows' state (StageModel.state_identity is None; see "
                "engine.can_suspend); detach it instead"
            )
        return self.identity

    def take_out(self, row: Row) -> SessionState:
        """The state of ``row`` (its encode settled); the model has forgotten the row
        when this returns, and the engine frees it. On an error nothing changed, but
        for a failed decode (the failure boundary: every in-flight chunk discarded)."""
        return self.take_out_many([row])[0]

    def take_out_many(self, rows: list[Row]) -> list[SessionState]:
        """:meth:`take_out` of several rows at once, in one export call and one decode
        of their chunks in flight (a checkpoint of many sessions costs about one's)."""
        identity = self.check(rows[0].session)
        for row in rows:
            self.check(row.session)
            for what, values in (("conditioning", row.conditioning), ("staged change", row.staged)):
                try:
                    encode_value(values)
                except WireError as exc:
                    raise StateError(
                        f"session {row.session!r} cannot be suspended: its {what} cannot be "
                        f"kept in a state ({exc}); detach it instead"
                    ) from None
        armed = [row for row in rows if row.armed]
        states: dict[int, RowState] = {}
        if armed:
            exported: list[RowState] = []
            batch = self._arena.batch(armed, [row.conditioning for row in armed])
            self._lanes.run(
                Lane.HOT, lambda b: exported.extend(self._model.export_rows(b.rows)), batch
            )
            states = {row.index: state for row, state in zip(armed, exported, strict=True)}
        pipeline = self._pipeline
        try:
            taken = pipeline.output.take([row.index for row in rows])
            decoded = pipeline.decode_apart(taken, self._apart)
        except BaseException:
            pipeline.fail()
            raise
        for row in armed:
            self._lanes.run(Lane.HOT, self._model.detach, row.index)
        return [
            SessionState(
                session=row.session,
                model=identity,
                chunk=int(self._arena.age[row.index]),
                armed=row.armed,
                conditioning=copy.deepcopy(row.conditioning),
                staged=copy.deepcopy(row.staged),
                row=states.get(row.index),
                pending=tuple(
                    np.array(out)
                    for batch in decoded
                    for index, out in zip(batch.rows, batch.out, strict=True)
                    if index == row.index
                ),
                latent=(self._manifest.latent_dtype, tuple(self._manifest.latent_shape)),
            )
            for row in rows
        ]

    def put_back(self, index: int, session: str, state: SessionState) -> Row:
        """Give free row ``index`` to ``session`` as ``state`` left it; StateError (no
        row taken) for a state this engine cannot resume."""
        self._refuse_foreign(session, state)
        conditioning = copy.deepcopy(state.conditioning)
        model_state = state.row
        if state.armed and model_state is not None:  # (armed without a row: refused)
            call = Batch([index], [session], [state.chunk], [conditioning])
            self._lanes.run(
                Lane.HOT, lambda b: self._model.import_rows(b.rows, [model_state]), call
            )
        row = self._arena.take(index, session, conditioning)
        self._arena.age[index] = state.chunk
        row.armed = state.armed
        row.staged = copy.deepcopy(state.staged)
        for n, frame in enumerate(state.pending):  # (at most one: checked)
            chunk = state.chunk - len(state.pending) + n
            held = Restored([index], [session], [chunk], [conditioning])
            held.carry["frames"] = [frame]
            held.generated_ns = time.monotonic_ns()
            self._pipeline.hold_restored(held)
        return row

    def _refuse_foreign(self, session: str, state: SessionState) -> None:
        identity = self.check(session)
        refused = f"session {session!r} cannot resume from this state"
        if not isinstance(state, SessionState):
            raise StateError(f"{refused}: a {type(state).__name__} is not a SessionState")
        if state.model != identity:
            raise StateError(
                f"{refused}: it is a state of {state.model}, this engine runs {identity}"
            )
        if state.session != session:
            raise StateError(f"{refused}: it is session {state.session!r}'s")
        manifest = self._manifest
        latent = (manifest.latent_dtype, tuple(manifest.latent_shape))
        if tuple(state.latent) != latent:
            raise StateError(f"{refused}: its chunks are {state.latent}, this engine's {latent}")
        if state.armed and state.row is None:
            raise StateError(f"{refused}: it is seeded but holds no row state")
        if len(state.pending) > (1 if manifest.pipelined else 0) or state.chunk < len(
            state.pending
        ):
            why = "a pipelined engine holds one" if manifest.pipelined else "this engine holds none"
            raise StateError(
                f"{refused}: it holds {len(state.pending)} chunks made and not yet emitted "
                f"({why}); resume it on an engine like the one it left"
            )
        for frame in state.pending:
            if (frame.dtype.str, frame.shape) != (np.dtype(latent[0]).str, latent[1]):
                raise StateError(f"{refused}: a pending chunk is {frame.dtype}{frame.shape}")
        try:
            for values in (state.conditioning, state.staged):
                check_conditioning(self._model, self._keys, values)
        except ValueError as exc:
            raise StateError(f"{refused}: {exc}") from None
