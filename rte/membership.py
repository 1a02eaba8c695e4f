"""Membership: who holds a row of a ComposedEngine, and how a session comes and goes.

Membership changes only at chunk boundaries, from the stepping thread, and
every change goes through :class:`Membership`:

* **Admission.** A new session (attached or resumed) takes the lowest free row
  (:mod:`rte.arena`), unless the engine admits no arrivals while a cohort runs
  (``midrun_attach=False``); a refusal is an :class:`~rte.errors.AdmissionError`
  that says what to do, and took nothing.
* **Arming.** New rows wait as pending until the model's ``seed_ready``; then
  ``seed`` runs once for the whole pending set on HOT. A failed seed is retried
  row by row, to find whose it was: only a row whose own seed fails is failed.
* **Encodes settled.** Completed encodes (:mod:`rte.encodes`) give their rows
  the new values; a row whose own encode failed is failed.
* **A session's own failure.** Its row is freed (an armed one the model forgets
  on HOT, after whatever ENCODE did to it) and it is FAILED, saying why, until
  it is detached (``arena.failed``, reported by :mod:`rte.outcomes`).
* **Leaving.** A detach waits for no lane: the model forgets the row on HOT,
  after the HOT work queued for it; only an encode of that row still under way
  is waited for (it rewrites the row). Freeing a row drops its in-flight chunk.

Every change that makes a cached plan stale bumps ``arena.gen``.
"""

from __future__ import annotations

import contextlib

from rte.arena import Arena, Row
from rte.encodes import Encodes
from rte.errors import AdmissionError
from rte.lanes import Lane, Lanes
from rte.pipeline import Pipeline
from rte.stages import StageModel, check_session_id


class Membership:
    """Args:
    model: the engine's model (its ``seed_ready``, ``seed``, ``detach``).
    lanes, arena, pipeline, encodes: the engine's.
    midrun_attach: when False, no session is admitted while any is seeded.
    """

    def __init__(
        self,
        model: StageModel,
        lanes: Lanes,
        arena: Arena,
        pipeline: Pipeline,
        encodes: Encodes,
        *,
        midrun_attach: bool,
    ) -> None:
        self._model = model
        self._lanes = lanes
        self._arena = arena
        self._pipeline = pipeline
        self._encodes = encodes
        self._midrun_attach = midrun_attach

    def admit(self, session: str) -> int:
        """The row a new session (attached or resumed) takes; AdmissionError if none."""
        arena = self._arena
        if not self._midrun_attach and any(r.armed for r in arena.by_session.values()):
            raise AdmissionError(
                f"session {session!r} refused: this engine admits no arrivals while a cohort "
                "runs (midrun_attach=False); retry once every session has detached"
            )
        free = arena.first_free()
        if free is None:
            raise AdmissionError(
                f"session {session!r} refused: all {len(arena.rows)} rows are in use; "
                "detach a session or retry later"
            )
        check_session_id(session)
        return free

    def arm(self) -> None:
        """Seed the pending rows, all together, once the model is ready for them."""
        pending = [r for r in self._arena.live() if not r.armed]
        if not pending or not self._model.seed_ready([r.index for r in pending]):
            return
        self._arena.gen += 1
        failure = self._seed(pending)
        if failure is None:
            return
        # Whose was it? Seeded each alone, only a row whose own seed fails is failed.
        alone = [(r, self._seed([r])) for r in pending] if len(pending) > 1 else []
        for r, exc in alone or [(pending[0], failure)]:
            if exc is not None:
                self._drop_failed(r, f"its seed failed: {type(exc).__name__}: {exc}")

    def settle_encodes(self, row: Row | None = None) -> None:
        """Settle the completed encodes (``row``: wait for its own first)."""
        encodes = self._encodes
        settled, failed = encodes.finish(row) if row else encodes.settle(self._arena.live())
        if settled:
            self._arena.gen += 1
            self._arena.conditioning_gen += 1
        for failed_row, why in failed:
            self._drop_failed(failed_row, why)

    def leave(self, row: Row) -> None:
        """Detach ``row``'s session: the model forgets the row, then it is freed. If
        the model's detach raises, the session stays attached (to retry)."""
        if row.armed:
            # No lane is waited for: the model forgets the row on HOT, after the HOT
            # work queued for it; DEFERRED reads only batches' carries, never rows. Only
            # an encode under way rewrites the row: its host side must have issued it
            # (a rare wait, for that encode alone) before HOT may forget the row.
            if row.encoding is not None and not row.encoding.done():
                with contextlib.suppress(Exception):  # the row is leaving: its failure too
                    row.encoding.result()
            try:
                self._lanes.run(Lane.HOT, self._model.detach, row.index)
            except BaseException:
                # The session stays attached (the model may still hold it); the
                # other rows' in-flight chunks are sound and are kept.
                self._pipeline.drain(quiet=True)
                raise
        self.free(row)

    def free(self, row: Row) -> None:
        """Give ``row`` back to the arena, with its in-flight chunk and its encode."""
        self._arena.release(row)
        self._pipeline.output.drop(row.index)  # its in-flight chunk goes with it
        self._encodes.forget(row)

    def _seed(self, rows: list[Row]) -> Exception | None:
        """Seed ``rows`` on HOT and arm them; what the seed raised, if it failed."""
        try:
            conditioning = [r.conditioning for r in rows]
            self._lanes.run(Lane.HOT, self._model.seed, self._arena.batch(rows, conditioning))
        except Exception as exc:
            return exc
        for r in rows:
            r.armed = True
        return None

    def _drop_failed(self, row: Row, why: str) -> None:
        """Free ``row``, whose own seed or encode failed (FAILED until it is detached);
        an armed row the model forgets on HOT, after whatever ENCODE did to it."""
        if row.armed:
            self._lanes.wait(Lane.HOT, self._lanes.mark(Lane.ENCODE))
            self._lanes.run(Lane.HOT, self._model.detach, row.index)
        self.free(row)
        self._arena.failed[row.session] = f"session {row.session!r} failed, its row freed: {why}"
