"""What a ComposedEngine step answers for each due session: a chunk, or why not.

One :class:`~rte.contract.StepResult` per due session, in due order: CHUNK
when the session emitted; otherwise ERROR (its action was refused), PENDING
(not yet seeded), ENCODING (sitting out a heavy change), WARMUP (its chunk
is in flight), or FAILED. The common step, every due row decoded as one batch
in due order, is answered by :func:`~rte.output.chunk_results` alone (or, for
a host that asks, by :class:`~rte.output.BatchResults`: the same, made when
looked at).

FAILED is how a session's own failure stays its own: when a session's seed or
heavy encode fails, the engine lets go of its row at once (free for the next
arrival; nobody else loses a chunk) and keeps why. Every due step answers the
session FAILED (:func:`report_failed`) until its host detaches it, which then
only forgets it (``ServeLoop`` does so at the first FAILED).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import numpy as np

from rte.arena import Plan
from rte.contract import ResultKind, StepResult, Timing
from rte.output import BatchResults, chunk_results
from rte.stages import Batch


def step_results(
    plan: Plan,
    decoded: list[Batch],
    rejected: dict[str, str],
    age: np.ndarray,
    started: int,
    lazy: bool = False,
) -> Sequence[StepResult]:
    """The result of each of the plan's rows: ``decoded`` the batches emitted,
    ``rejected`` the sessions whose action was refused (with why), ``age`` the
    chunks generated per row. ``lazy``: the common step's (every due row decoded,
    in due order) as a :class:`~rte.output.BatchResults`, made when looked at."""
    now = time.monotonic_ns()
    if len(decoded) == 1 and decoded[0].rows is plan.index:  # every due row, in due order
        return BatchResults(decoded[0], now) if lazy else chunk_results(decoded[0], now)
    emitted = emitted_by_row(decoded, now)
    timing = Timing(started, now)
    results = []
    for r in plan.rows:
        result = emitted.get(r.index)
        if result is None:
            error = rejected.get(r.session)
            if error is not None:
                kind, chunk = ResultKind.ERROR, -1
            elif not r.armed:
                kind, chunk = ResultKind.PENDING, int(age[r.index])
            elif r.encoding is not None:
                kind, chunk = ResultKind.ENCODING, int(age[r.index])
            else:
                kind, chunk = ResultKind.WARMUP, int(age[r.index])
            result = StepResult(r.session, chunk, kind, None, timing, error)
        results.append(result)
    return results


def emitted_by_row(decoded: list[Batch], now: int) -> dict[int, StepResult]:
    """The CHUNK result of every row of the decoded batches, by row."""
    return {r: c for b in decoded for r, c in zip(b.rows, chunk_results(b, now), strict=True)}


def report_failed(
    failed: dict[str, str], due: Iterable[str], results: Sequence[StepResult], started: int
) -> Sequence[StepResult]:
    """``results`` with a FAILED result for each due session in ``failed`` (session:
    why), all in due order; ``results`` itself when none is due."""
    order = dict.fromkeys(due)
    told = [s for s in order if s in failed]
    if not told:
        return results
    timing = Timing(started, time.monotonic_ns())
    news = [StepResult(s, -1, ResultKind.FAILED, None, timing, failed[s]) for s in told]
    position = {s: n for n, s in enumerate(order)}
    return sorted([*results, *news], key=lambda r: position[r.session])
