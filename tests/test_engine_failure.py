"""The failure boundary and the lifecycle order of lanes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from probe_model import InjectedFailure, chunks_of, make_engine
from rte import Action, Lane, ResultKind


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


def test_seed_failure_leaves_rows_pending_and_a_later_step_seeds_them() -> None:
    engine, model = make_engine(4)
    engine.attach("a")
    model.fail["seed"] = InjectedFailure("seed broke")
    with pytest.raises(InjectedFailure):
        engine.step(["a"])
    (r,) = engine.step(["a"])
    assert r.kind is ResultKind.WARMUP
    assert model.names().count("seed") == 2
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


def test_encode_failure_propagates_and_the_row_keeps_its_old_value() -> None:
    engine, model = make_engine(2)
    engine.attach("a", {"prompt": "one"})
    engine.step(["a"])
    model.fail["encode_prompt"] = InjectedFailure("encode broke")
    engine.step(["a"], {"a": Action({"prompt": "two"})})
    engine.lanes.drain()
    with pytest.raises(InjectedFailure):
        engine.step(["a"])
    (r,) = engine.step(["a"])
    assert r.kind is ResultKind.WARMUP  # back in the cohort with its old prompt
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
    assert model.names() == [
        "seed", "denoise", "finalize",  # step 1: seed at the boundary, then HOT
        "encode_prompt", "decode",  # step 2: a sits out; its chunk 0 is decoded
        "denoise", "finalize",  # step 3: rejoined
        "denoise", "finalize", "decode",  # step 4: HOT chunk 2, DEFERRED chunk 1
        "decode",  # finalize: chunk 2
        "detach",
    ]  # fmt: skip
    engine.close()
