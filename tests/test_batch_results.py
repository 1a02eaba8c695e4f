"""A step's results made only when looked at (``ComposedEngine(lazy_results=True)``).

The daemon delivers a step's chunks from its slab leases and never reads a
result object per chunk; :class:`~rte.output.BatchResults` is the common
step's answer made lazily. These hold it to the list it stands for: the same
results whatever is asked of it, the same answers from an engine that makes
them lazily as from one that makes them at once, the same receipts, and
nothing made where the daemon's delivery does not look.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from rte.composed import ComposedEngine
from rte.contract import Action, ResultKind, StepResult
from rte.delivery import Delivery
from rte.models.null import NullModel, tag_of
from rte.output import BatchResults, chunk_results
from rte.receipts import Receipts
from rte.serve import ServeLoop
from rte.stages import Batch


def _batch(n: int) -> Batch:
    batch = Batch(list(range(n)), [f"s{i}" for i in range(n)], [10 + i for i in range(n)], None)
    batch.out = [np.full(4, i, np.uint8) for i in range(n)]
    batch.generated_ns = 123
    return batch


def test_a_batch_answers_as_its_list_of_chunk_results() -> None:
    batch = _batch(5)
    lazy, eager = BatchResults(batch, 456), chunk_results(batch, 456)
    assert len(lazy) == 5 and lazy.timing == eager[0].timing
    assert not lazy.is_made  # its length and time: read from the batch, nothing made
    assert lazy[0] == eager[0] and lazy[-1] == eager[-1] and lazy[2].latent is batch.out[2]
    assert lazy.is_made  # looked at: made, once
    with pytest.raises(IndexError):
        lazy[5]
    assert lazy[1:3] == eager[1:3]
    assert list(lazy) == eager and lazy == eager and eager == lazy
    assert lazy == BatchResults(batch, 456) and lazy != eager[:4] and lazy != "not a list"
    assert [r.session for r in lazy if r.kind is ResultKind.CHUNK] == batch.sessions
    assert lazy.index(eager[3]) == 3 and eager[4] in lazy
    assert "s4" in repr(lazy)


def _answers(results: Sequence[StepResult]) -> list[tuple[Any, ...]]:
    """What a step answered, less its times (two engines never share a clock)."""
    return [
        (r.session, r.chunk, r.kind, None if r.latent is None else tag_of(r.latent), r.error)
        for r in results
    ]


@pytest.mark.parametrize("pipelined", [True, False])
def test_a_lazy_engine_answers_every_step_as_an_eager_one(pipelined: bool) -> None:
    engines = [ComposedEngine(NullModel(8, pipelined=pipelined), lazy_results=x) for x in (1, 0)]
    lazy, eager = engines
    kinds: set[ResultKind] = set()
    batches = 0
    try:
        for step in range(40):
            due = [f"s{k}" for k in range(8) if k <= step // 4 and (step % 6 or k != 2)]
            if step == 20:  # one leaves, one comes back: warming up again
                for engine in engines:
                    engine.detach("s1")
            for engine in engines:
                for session in due:
                    engine.attach(session)
            actions = {s: Action({"tag": step}) for s in due[::2]}
            if step % 7 == 3 and due:  # a key the model does not know: refused
                actions[due[-1]] = Action({"no such key": 1})
            got, want = lazy.step(due, actions), eager.step(due, actions)
            assert isinstance(want, list)
            batches += type(got) is BatchResults
            assert _answers(got) == _answers(want), step
            kinds.update(r.kind for r in want)
    finally:
        for engine in engines:
            engine.close()
    assert batches > 10  # the common step was answered lazily...
    assert {ResultKind.CHUNK, ResultKind.ERROR} <= kinds  # ...and the others as lists


@pytest.mark.parametrize("acting", [1, 3, 6])
def test_receipts_handed_a_batch_mark_what_its_list_would(acting: int) -> None:
    batch = _batch(6)
    seqs = {f"s{k}": 100 + k for k in range(acting)} | {"not in the batch": 7}
    from_batch, from_list = Receipts(pipelined=True), Receipts(pipelined=True)
    lazy = BatchResults(batch, 1)
    from_batch.handed(lazy, seqs)
    from_list.handed(chunk_results(batch, 1), seqs)
    assert not lazy.is_made  # read from the batch's columns
    for session in [*batch.sessions, "not in the batch"]:
        assert from_batch.of(session) == from_list.of(session)
    assert from_batch.of("s0") == (0, ((11, 100),))


def test_the_daemons_delivery_makes_no_result_of_a_step_acted_on() -> None:
    """The serve loop as the daemon runs it (no stamp; ``emit`` reads the count
    and the time): a step's results are never made, actions handed or not."""
    seen: list[Sequence[StepResult]] = []

    def emit(results: Sequence[StepResult]) -> tuple[list[Any], int]:
        seen.append(results)
        if not isinstance(results, BatchResults):  # the first step: all warming up
            return [], 0
        return [("lease", results.timing.emitted_ns)], len(results)

    engine = ComposedEngine(NullModel(4), lazy_results=True)
    loop = ServeLoop(engine, stamp=False, emit=emit)
    try:
        for k in range(4):
            engine.attach(f"s{k}")
            loop.conditioning[f"s{k}"] = {}
        for step in range(6):
            for k in range(0, 4, 2):
                loop.pending.put(f"s{k}", {"tag": step}, seq=step + 1)
            out = loop.step()
            if step:  # (the pipeline's first step emits nothing)
                assert out and out[0][0] == "lease"
    finally:
        engine.close()
    lazy = [r for r in seen if isinstance(r, BatchResults)]
    assert len(lazy) == 5 and not any(r.is_made for r in lazy)
    assert loop.receipts.of("s0")[1][-1] == (5, 6)  # still marked: chunk 5 made with seq 6


def test_a_stamping_delivery_makes_them_all() -> None:
    """In process (the results are the caller's): every chunk delivered, stamped."""
    receipts = Receipts(pipelined=True)
    receipts.handed(chunk_results(_batch(3), 0), {"s1": 9})
    delivery = Delivery(receipts, True, None, lambda *_: None)
    batch = _batch(3)
    batch.chunks = [11, 12, 13]  # (s1 acted before chunk 11 was made: 12 applies it)
    out = delivery(BatchResults(batch, 5))
    assert [r.applied for r in out] == [0, 9, 0]  # type: ignore[union-attr]
