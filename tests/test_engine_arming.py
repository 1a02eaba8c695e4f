"""Arming: seed_ready, one seed per pending set on HOT, joins, re-seed, midrun_attach."""

from __future__ import annotations

import numpy as np
import pytest

from probe_model import chunks_of, make_engine
from rte import AdmissionError, Lane, ResultKind

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams


def test_seed_waits_for_seed_ready_then_runs_once_for_the_whole_pending_set() -> None:
    engine, model = make_engine(4, need_pending=2)
    engine.attach("a")
    results = engine.step(["a"])
    assert [r.kind for r in results] == [ResultKind.PENDING]
    assert "seed" not in model.names()
    engine.attach("b")
    engine.step(["a", "b"])
    seeds = [c for c in model.calls if c.name == "seed"]
    assert len(seeds) == 1
    assert seeds[0].rows == (0, 1)
    assert seeds[0].lane is Lane.HOT
    # seed ran before the step's first HOT stage, at the step boundary
    names = model.names()
    assert names.index("seed") < names.index("denoise")
    engine.close()


def test_join_keeps_residents_in_flight_output() -> None:
    engine, model = make_engine(4)
    engine.attach("a")
    engine.attach("b")
    engine.step(["a", "b"])  # warm-up: chunk 0 in flight for both
    engine.attach("c")
    results = {r.session: r for r in engine.step(["a", "b", "c"])}
    assert results["a"].kind is ResultKind.CHUNK and results["a"].chunk == 0
    assert results["b"].kind is ResultKind.CHUNK and results["b"].chunk == 0
    assert results["c"].kind is ResultKind.WARMUP
    seeds = [c for c in model.calls if c.name == "seed"]
    assert [s.rows for s in seeds] == [(0, 1), (2,)]  # only the newcomer is seeded
    results = {r.session: r for r in engine.step(["a", "b", "c"])}
    assert [results[s].chunk for s in "abc"] == [1, 1, 0]
    engine.close()


def test_membership_changes_only_at_chunk_boundaries() -> None:
    engine, model = make_engine(4)
    engine.attach("a")
    members = {"a"}
    for step in range(6):
        if step == 2:
            engine.attach("b")
            members.add("b")
        if step == 4:
            engine.finalize(["a"])
            engine.detach("a")
            members.discard("a")
        before = len(model.calls)
        engine.step(sorted(members))
        for call in model.calls[before:]:
            assert set(call.sessions) <= members, (step, call)
    engine.close()


def test_drained_arena_seeds_afresh_and_reset_restarts_the_stream() -> None:
    engine, model = make_engine(2)
    engine.attach("a", {"prompt": "p"})
    first = [chunks_of(engine.step(["a"])) for _ in range(4)]
    engine.detach("a")
    engine.attach("a", {"prompt": "p"})  # Reset = detach + attach
    again = [chunks_of(engine.step(["a"])) for _ in range(4)]
    assert model.names().count("seed") == 2
    assert [c.get("a", (None,))[0] for c in again] == [None, 0, 1, 2]
    for x, y in zip(first, again, strict=True):
        if x:
            assert x["a"][0] == y["a"][0]
            np.testing.assert_array_equal(x["a"][1], y["a"][1])
    engine.close()


def test_midrun_attach_false_refuses_arrivals_until_the_arena_drains() -> None:
    engine, _ = make_engine(4, midrun_attach=False)
    engine.attach("a")
    engine.attach("b")  # nothing seeded yet: still admitted
    engine.step(["a", "b"])
    with pytest.raises(AdmissionError, match="midrun_attach=False"):
        engine.attach("c")
    engine.detach("a")
    with pytest.raises(AdmissionError):
        engine.attach("c")
    engine.detach("b")
    engine.attach("c")
    assert engine.sessions() == {"c": 0}
    engine.close()
