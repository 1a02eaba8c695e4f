"""The failure boundary and the lifecycle order of lanes."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from probe_model import InjectedFailure, ProbeModel, chunks_of, make_engine
from rte import Action, Batch, ComposedEngine, HeapAllocator, Lane, ResultKind

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams


def _reference(sessions: str, steps: int) -> dict[str, dict[int, np.ndarray]]:
    engine, _ = make_engine(4)
    for s in sessions:
        engine.attach(s)
    out: dict[str, dict[int, np.ndarray]] = {s: {} for s in sessions}
    for _ in range(steps):
        for s, (c, x) in chunks_of(engine.step(list(sessions))).items():
            out[s][c] = x
    engine.close()
    return out


@pytest.mark.parametrize("stage", ["denoise", "finalize", "decode"])
def test_stage_failure_discards_in_flight_output_and_the_engine_recovers(stage: str) -> None:
    reference = _reference("ab", 12)
    engine, model = make_engine(4)
    engine.attach("a")
    engine.attach("b")
    emitted: dict[str, list[int]] = {"a": [], "b": []}
    failures = 0
    for step in range(10):
        if step == 4:
            model.fail[stage] = InjectedFailure(f"{stage} broke")
        try:
            results = engine.step(["a", "b"])
        except InjectedFailure:
            failures += 1
            continue
        for s, (chunk, latent) in chunks_of(results).items():
            emitted[s].append(chunk)
            # never stale: every chunk is exactly what a failure-free run made
            np.testing.assert_array_equal(latent, reference[s][chunk])
    assert failures == 1
    for s in "ab":
        assert emitted[s] == sorted(set(emitted[s]))  # strictly increasing: never twice
        assert emitted[s][:3] == [0, 1, 2]
        assert len(emitted[s]) >= 5  # and it went on after the failure
    engine.close()


def test_failure_propagates_only_after_the_encode_lane_is_drained() -> None:
    engine, model = make_engine(4)
    engine.attach("a", {"prompt": "one"})
    engine.attach("b")
    engine.step(["a", "b"])
    model.encode_gate = threading.Event()
    engine.step(["a", "b"], {"a": Action({"prompt": "two"})})  # encode held at the gate
    model.fail["denoise"] = InjectedFailure("hot broke")
    opener = threading.Timer(0.2, model.encode_gate.set)
    opener.start()
    with pytest.raises(InjectedFailure):
        engine.step(["a", "b"])
    # the encode had finished before the failure reached us
    assert model.encodes == [("a", "two")]
    opener.join(5)
    engine.close()


def test_a_seed_failure_fails_its_session_and_a_new_attach_seeds_again() -> None:
    engine, model = make_engine(4)
    engine.attach("a")
    model.fail["seed"] = InjectedFailure("seed broke")
    (r,) = engine.step(["a"])  # the step itself succeeds: the failure is a's alone
    assert r.kind is ResultKind.FAILED and "seed broke" in (r.error or "")
    assert engine.sessions() == {}  # its row is free
    engine.detach("a")
    engine.attach("a")
    (r,) = engine.step(["a"])
    assert r.kind is ResultKind.WARMUP
    assert model.names().count("seed") == 2
    assert "detach" not in model.names()  # never seeded: the model holds nothing of it
    engine.close()


def test_detach_failure_keeps_the_session_and_spares_the_others() -> None:
    engine, model = make_engine(4)
    engine.attach("a")
    engine.attach("b")
    engine.step(["a", "b"])
    model.fail["detach"] = InjectedFailure("detach broke")
    with pytest.raises(InjectedFailure):
        engine.detach("a")
    assert engine.sessions() == {"a": 0, "b": 1}
    engine.detach("a")  # a retry goes through
    results = [r for _ in range(3) for r in engine.step(["b"]) if r.has_chunk]
    assert [r.chunk for r in results] == [0, 1, 2]  # b's in-flight chunk survived
    engine.close()


def test_an_encode_failure_fails_its_session_and_the_model_forgets_its_row_on_hot() -> None:
    engine, model = make_engine(2)
    engine.attach("a", {"prompt": "one"})
    engine.step(["a"])
    model.fail["encode_prompt"] = InjectedFailure("encode broke")
    engine.step(["a"], {"a": Action({"prompt": "two"})})
    engine.lanes.drain()
    (r,) = engine.step(["a"])
    assert r.kind is ResultKind.FAILED and "encode broke" in (r.error or "")
    (forgot,) = [c for c in model.calls if c.name == "detach"]
    assert forgot.rows == (0,) and forgot.lane is Lane.HOT
    assert model.names()[-1] == "detach"  # nothing ran for it after its encode failed
    engine.close()


def test_lifecycle_runs_every_call_on_its_lane_in_order() -> None:
    engine, model = make_engine(4)
    engine.attach("a", {"prompt": "p"})
    engine.step(["a"])
    engine.step(["a"], {"a": Action({"prompt": "q"})})
    engine.lanes.drain()
    engine.step(["a"])
    engine.step(["a"])
    engine.finalize()
    engine.detach("a")
    lanes = {
        "seed": Lane.HOT,
        "denoise": Lane.HOT,
        "finalize": Lane.HOT,
        "decode": Lane.DEFERRED,
        "encode_prompt": Lane.ENCODE,
        "detach": Lane.HOT,
    }
    for call in model.calls:
        assert call.lane is lanes[call.name], call
    issued = [
        "seed", "denoise", "finalize",  # step 1: seed at the boundary, then HOT
        "encode_prompt", "decode",  # step 2: a sits out; its chunk 0 is decoded
        "denoise", "finalize",  # step 3: rejoined
        "decode", "denoise", "finalize",  # step 4: DEFERRED chunk 1, then HOT chunk 2
        "decode",  # finalize: chunk 2
        "detach",
    ]  # fmt: skip
    for lane in Lane:  # each lane runs its calls in the order they were issued
        on_lane = [c.name for c in model.calls if c.lane is lane]
        assert on_lane == [name for name in issued if lanes[name] is lane]
    if engine.lanes.kind == "cpu":  # inline lanes run them when issued
        assert model.names() == issued
    engine.close()


class LeasingAllocator:
    """Leases buffers per batch, as a transport does, and checks every lease comes back."""

    def __init__(self, model: ProbeModel) -> None:
        self.heap = HeapAllocator(model.manifest())
        self.leased: dict[tuple[str, int], np.ndarray[Any, Any]] = {}
        self.discards: list[list[tuple[str, int]]] = []

    def allocate(self, batch: Batch) -> list[np.ndarray[Any, Any]]:
        buffers = self.heap.allocate(batch)
        keys = zip(batch.sessions, batch.chunks, strict=True)
        for key, buffer in zip(keys, buffers, strict=True):
            assert key not in self.leased
            self.leased[key] = buffer
        return buffers

    def discard(self, batch: Batch, buffers: list[np.ndarray[Any, Any]]) -> None:
        keys = list(zip(batch.sessions, batch.chunks, strict=True))
        for key, buffer in zip(keys, buffers, strict=True):
            assert self.leased.pop(key) is buffer
        self.discards.append(keys)

    def returned(self, results: list[Any]) -> None:
        """The call that leased the buffers has returned: each was emitted or discarded."""
        for r in results:
            if r.has_chunk:
                assert self.leased.pop((r.session, r.chunk)) is r.latent
        assert self.leased == {}


@pytest.mark.parametrize("call", ["step", "finalize"])
def test_a_failed_call_discards_each_batch_it_allocated_once(call: str) -> None:
    model = ProbeModel(4)
    allocator = LeasingAllocator(model)
    engine = model.bind(ComposedEngine(model, allocator=allocator))
    engine.attach("a")
    engine.attach("b")
    for _ in range(3):
        allocator.returned(engine.step(["a", "b"]))
    allocator.returned(engine.step(["b"]))  # a's chunk 2 stays in an older HOT batch than b's 3
    model.fail["decode"] = InjectedFailure("decode broke")
    with pytest.raises(InjectedFailure):
        if call == "step":
            engine.step(["a", "b"])
        else:
            engine.finalize()
    assert allocator.discards == [[("a", 2)]]  # the first batch failed; the second never ran
    allocator.returned([])
    results = [r for _ in range(3) for r in engine.step(["a", "b"]) if r.has_chunk]
    chunks = {s: [r.chunk for r in results if r.session == s] for s in "ab"}
    assert chunks["a"][0] > 2 and chunks["b"][0] > 3  # nothing stale, nothing twice
    engine.close()
