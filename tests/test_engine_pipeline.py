"""Pipelining, the deferred lane's lag, finalize, due subsets, output shape and invariance."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from probe_model import ProbeModel, chunks_of, make_engine
from rte import (
    Action,
    Batch,
    ComposedEngine,
    HeapAllocator,
    Lane,
    Manifest,
    ResultKind,
    StepResult,
    Timing,
)

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams


class RecordingAllocator:
    """The heap allocator, recording every batch it is asked for."""

    def __init__(self, manifest: Manifest) -> None:
        self.heap = HeapAllocator(manifest)
        self.allocated: list[tuple[list[str], list[int], int, list[np.ndarray[Any, Any]]]] = []

    def allocate(self, batch: Batch) -> list[np.ndarray[Any, Any]]:
        buffers = self.heap.allocate(batch)
        self.allocated.append(
            (list(batch.sessions), list(batch.chunks), batch.generated_ns, buffers)
        )
        return buffers

    def discard(self, batch: Batch, buffers: list[np.ndarray[Any, Any]]) -> None:
        raise AssertionError("nothing failed")


def _stream(
    pipelined: bool, sessions: list[str], steps: int, **kwargs: object
) -> dict[str, dict[int, np.ndarray]]:
    engine, _ = make_engine(8, pipelined=pipelined, **kwargs)  # type: ignore[arg-type]
    for s in sessions:
        engine.attach(s, {"prompt": f"prompt of {s}"})
    out: dict[str, dict[int, np.ndarray]] = {s: {} for s in sessions}
    for i in range(steps):
        actions = {s: Action({"move": (i % 3, -1)}) for s in sessions if i % 2}
        for s, (chunk, latent) in chunks_of(engine.step(sessions, actions)).items():
            assert chunk not in out[s]
            out[s][chunk] = latent
    engine.close()
    return out


def test_pipelined_first_step_emits_nothing_then_one_chunk_each_step() -> None:
    engine, _ = make_engine(2)
    assert engine.manifest().pipeline_depth_chunks == 2
    engine.attach("a")
    assert [r.kind for r in engine.step(["a"])] == [ResultKind.WARMUP]
    for n in range(5):
        (r,) = engine.step(["a"])
        assert r.kind is ResultKind.CHUNK and r.chunk == n
    engine.close()


def test_non_pipelined_emits_at_once_with_depth_one() -> None:
    engine, model = make_engine(2, pipelined=False)
    assert engine.manifest().pipeline_depth_chunks == 1
    engine.attach("a")
    for n in range(3):
        (r,) = engine.step(["a"])
        assert r.kind is ResultKind.CHUNK and r.chunk == n
    # both stages ran in the same step, on their own lanes
    assert [(c.name, c.lane) for c in model.calls if c.name in ("denoise", "decode")][:2] == [
        ("denoise", Lane.HOT),
        ("decode", Lane.DEFERRED),
    ]
    engine.close()


def test_deferred_lags_hot_by_exactly_one_chunk() -> None:
    engine, model = make_engine(2)
    engine.attach("a")
    for _ in range(5):
        engine.step(["a"])
    made = [c.chunks for c in model.calls if c.name == "denoise"]
    decoded = [c.chunks for c in model.calls if c.name == "decode"]
    assert made == [(n,) for n in range(5)] and decoded == [(n,) for n in range(4)]
    if engine.lanes.kind == "cpu":  # run as issued: each step decodes n-1, then makes n
        order = [(c.name, c.chunks) for c in model.calls if c.name in ("denoise", "decode")]
        assert order[0] == ("denoise", (0,))
        for n in range(1, 5):
            assert order[2 * n - 1 : 2 * n + 1] == [("decode", (n - 1,)), ("denoise", (n,))]
    # and the content is the same as generating and decoding in one step
    piped = _stream(True, ["a"], 7)
    flat = _stream(False, ["a"], 6)
    assert piped.keys() == flat.keys()
    assert sorted(piped["a"]) == sorted(flat["a"]) == list(range(6))
    for chunk, latent in flat["a"].items():
        np.testing.assert_array_equal(piped["a"][chunk], latent)


@pytest.mark.parametrize("pipelined", [True, False])
def test_solo_and_batched_are_bit_identical_and_sessions_differ(pipelined: bool) -> None:
    batched = _stream(pipelined, ["a", "b", "c"], 6)
    for s in "abc":
        solo = _stream(pipelined, [s], 6)
        assert solo[s].keys() == batched[s].keys()
        for chunk in solo[s]:
            assert np.array_equal(solo[s][chunk], batched[s][chunk]), (s, chunk)
    assert not np.array_equal(batched["a"][2], batched["b"][2])


def test_output_shape_and_dtype_follow_the_manifest() -> None:
    engine, _ = make_engine(2)
    manifest = engine.manifest()
    engine.attach("a")
    engine.step(["a"])
    (r,) = engine.step(["a"])
    assert r.latent is not None
    assert r.latent.shape == manifest.latent_shape == (64, 64, 3)
    assert r.latent.dtype == np.dtype(manifest.latent_dtype)
    assert manifest.latent_nbytes == r.latent.nbytes
    assert r.timing.emitted_ns >= r.timing.generated_ns
    engine.close()


def test_finalize_emits_in_flight_chunks_without_generating() -> None:
    engine, model = make_engine(4)
    for s in "ab":
        engine.attach(s)
    engine.step(["a", "b"])
    engine.step(["a", "b"])
    denoises = model.names().count("denoise")
    final = engine.finalize(["a"])
    assert [(r.session, r.chunk, r.kind) for r in final] == [("a", 1, ResultKind.CHUNK)]
    assert model.names().count("denoise") == denoises
    assert engine.finalize(["a"]) == []  # nothing left in flight
    results = {r.session: r for r in engine.step(["a", "b"])}
    assert results["a"].kind is ResultKind.WARMUP  # its pipeline refills
    assert results["b"].chunk == 1
    assert [r.session for r in engine.finalize()] == ["a", "b"]
    engine.close()


def test_lossless_pipelined_detach_removes_only_that_row() -> None:
    engine, _ = make_engine(4)
    for s in "abc":
        engine.attach(s)
    seen: dict[str, list[int]] = {s: [] for s in "abc"}
    for step in range(6):
        if step == 3:
            for r in engine.finalize(["b"]):
                seen[r.session].append(r.chunk)
            engine.detach("b")
        due = [s for s in "abc" if s in engine.sessions()]
        for r in engine.step(due):
            if r.has_chunk:
                seen[r.session].append(r.chunk)
    assert seen["a"] == seen["c"] == [0, 1, 2, 3, 4]
    assert seen["b"] == [0, 1, 2]  # its last chunk came out through finalize, none lost
    engine.close()


def test_sessions_not_due_do_not_age_and_resume_where_they_were() -> None:
    engine, _ = make_engine(4)
    engine.attach("a")
    engine.attach("b")
    b_chunks: dict[int, np.ndarray] = {}
    for step in range(8):
        due = ["a", "b"] if step in (0, 1, 5, 6, 7) else ["a"]
        if step == 2:
            assert engine.age("b") == 2
        results = engine.step(due)
        assert [r.session for r in results] == due
        b_chunks.update({c: x for s, (c, x) in chunks_of(results).items() if s == "b"})
    assert engine.age("b") == 5 and engine.age("a") == 8
    assert sorted(b_chunks) == [0, 1, 2, 3]  # chunk 1 waited in flight while b was not due
    solo, _ = make_engine(4)
    solo.attach("b")
    alone = {c: x for _ in range(5) for s, (c, x) in chunks_of(solo.step(["b"])).items()}
    assert alone.keys() == b_chunks.keys()
    for chunk, latent in alone.items():
        np.testing.assert_array_equal(latent, b_chunks[chunk])
    engine.close()
    solo.close()


def test_the_allocator_is_asked_once_per_decoded_batch_and_its_buffers_are_the_chunks() -> None:
    model = ProbeModel(4)
    allocator = RecordingAllocator(model.manifest())
    engine = model.bind(ComposedEngine(model, allocator=allocator))
    for s in "abc":
        engine.attach(s)
    engine.step(["a", "b", "c"])
    assert allocator.allocated == []  # nothing decoded yet
    for n in range(3):
        results = engine.step(["c", "a", "b"])
        ((sessions, chunks, generated, buffers),) = allocator.allocated  # one batch
        allocator.allocated.clear()
        assert sorted(sessions) == ["a", "b", "c"] and chunks == [n] * 3 and generated > 0
        assert [r.session for r in results] == ["c", "a", "b"]
        by_session = dict(zip(sessions, buffers, strict=True))
        for r in results:
            assert r.has_chunk and r.chunk == n and r.latent is by_session[r.session]
            assert r.timing is results[0].timing and r.timing.generated_ns == generated
        assert all(b.base is not None and b.base is buffers[0].base for b in buffers)  # one block
    engine.step(["b"])  # a due subset decodes only its own rows
    assert [(a[0], a[1]) for a in allocator.allocated] == [(["b"], [3])]
    allocator.allocated.clear()
    final = engine.finalize()  # c and a from one HOT batch (its row order), b from the next
    assert [(a[0], a[1]) for a in allocator.allocated] == [(["c", "a"], [3, 3]), (["b"], [4])]
    assert [(r.session, r.chunk) for r in final] == [("a", 3), ("b", 4), ("c", 3)]
    engine.close()


class SayingAllocator:
    """Rows of one fresh block per batch, saying they are one run (``out_block``)
    only when ``says``: the allocator's word, which the engine carries."""

    def __init__(self, manifest: Manifest, *, says: bool) -> None:
        self.shape, self.dtype, self.says = manifest.latent_shape, manifest.latent_dtype, says
        self.made: list[tuple[Batch, np.ndarray[Any, Any]]] = []

    def allocate(self, batch: Batch) -> list[np.ndarray[Any, Any]]:
        block = np.empty((len(batch.rows), *self.shape), self.dtype)
        if self.says:
            batch.out_block = block
        self.made.append((batch, block))
        return list(block)

    def discard(self, batch: Batch, buffers: list[np.ndarray[Any, Any]]) -> None:
        raise AssertionError("nothing failed")


@pytest.mark.parametrize("says", [True, False])
def test_whether_a_batch_is_one_run_is_the_allocators_word_carried_as_is(says: bool) -> None:
    """Decided once, where the buffers are made: the engine never looks at their
    addresses to decide again (it did, for an allocator that said nothing)."""
    model = ProbeModel(4)
    allocator = SayingAllocator(model.manifest(), says=says)
    engine = model.bind(ComposedEngine(model, allocator=allocator))
    for s in "abc":
        engine.attach(s)
    for _ in range(3):
        engine.step(["a", "b", "c"])
    engine.step(["b"])  # a subset: a batch of its own
    assert len(allocator.made) == 3
    for batch, block in allocator.made:
        assert batch.out_block is (block if says else None)
        assert all(o.base is block for o in batch.out)  # the chunks are written in place
    engine.close()


def test_results_and_timings_are_light_immutable_records() -> None:
    timing = Timing(5, 9)
    assert (timing.pushed_ns, timing.taken_ns, timing.latency_ns) == (0, 0, 4)
    assert timing._replace(pushed_ns=11, taken_ns=12) == Timing(5, 9, 11, 12)
    result = StepResult("a", 3, ResultKind.WARMUP, None, timing)
    assert result.error is None and not result.has_chunk
    with pytest.raises(AttributeError):
        result.chunk = 4  # type: ignore[misc]
    with pytest.raises(AttributeError):
        timing.emitted_ns = 1  # type: ignore[misc]


def test_a_changing_due_list_is_never_served_from_a_stale_plan() -> None:
    engine, _ = make_engine(4)
    for s in "ab":
        engine.attach(s)
    emitted: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    def step(due: list[str]) -> None:
        results = engine.step(due)
        assert [r.session for r in results] == list(dict.fromkeys(due))  # once each, in order
        for r in results:
            if r.has_chunk:
                emitted[r.session].append(r.chunk)

    for due in (["a", "b"], ["a", "b"], ["b", "a"], ["a"], ["a", "b"], ["a", "a", "b"]):
        step(due)
    engine.detach("a")
    engine.attach("c")  # takes a's row, whose last chunk was still in flight
    assert engine.sessions()["c"] == 0
    for _ in range(3):
        step(["c", "b"])
    assert emitted == {"a": [0, 1, 2, 3, 4], "b": [0, 1, 2, 3, 4, 5, 6], "c": [0, 1]}
    engine.close()
