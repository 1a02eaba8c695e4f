"""Pipelining, the deferred lane's lag, finalize, due subsets, output shape and invariance."""

from __future__ import annotations

import numpy as np
import pytest

from probe_model import chunks_of, make_engine
from rte import Action, Lane, ResultKind


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
    steps: list[dict[str, tuple[int, ...]]] = []
    for call in model.calls:
        if call.name == "denoise":
            steps.append({})
        if call.name in ("denoise", "decode"):
            steps[-1][call.name] = call.chunks
    assert steps[0] == {"denoise": (0,)}
    for n, step in enumerate(steps[1:], start=1):
        assert step == {"denoise": (n,), "decode": (n - 1,)}
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
