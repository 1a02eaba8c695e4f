"""ReplicaEngine: routing, pooling, B=1 parity and failure isolation."""

from __future__ import annotations

import numpy as np
import pytest
from daemon_harness import DaemonProcess, Deadline
from poison_model import POISON, PoisonModel

from probe_model import InjectedFailure, ProbeModel, chunks_of, make_engine
from rte import AdmissionError, ComposedEngine, ReplicaEngine, ResultKind
from rte.models import ReferenceModel
from rte.models.null import tag_of


def _replica(max_children: int, rows: int = 1) -> tuple[ReplicaEngine, list[ProbeModel]]:
    models: list[ProbeModel] = []

    def factory() -> ComposedEngine:
        model = ProbeModel(rows)
        models.append(model)
        return model.bind(ComposedEngine(model))

    return ReplicaEngine(factory, max_children), models


def test_routes_each_session_to_a_child_with_room_and_refuses_beyond() -> None:
    engine, _ = _replica(3)
    assert engine.manifest().max_sessions == 3
    for s in "abc":
        engine.attach(s)
    owners = {s: engine.child_of(s) for s in "abc"}
    assert len({id(c) for c in owners.values()}) == 3
    engine.attach("a")  # idempotent
    with pytest.raises(AdmissionError, match="all 3 child engines are full"):
        engine.attach("d")


def test_a_new_child_that_refused_its_first_session_is_pooled_for_the_next() -> None:
    engine = ReplicaEngine.of_model(lambda: ReferenceModel(1), 2)
    engine.attach("a")
    with pytest.raises(ValueError, match="unknown key"):  # refused by the second child
        engine.attach("b", {"unknown key": 1})
    assert len(engine.children()) == 2 and engine.children()[1] in engine.pooled()
    engine.attach("c")  # (it was lost: neither pooled nor busy, "all 2 full")
    assert engine.child_of("c") is engine.children()[1]


def test_batched_children_fill_before_new_ones_are_made() -> None:
    engine, _ = _replica(2, rows=2)
    for s in "abc":
        engine.attach(s)
    assert engine.child_of("a") is engine.child_of("b")
    assert engine.child_of("c") is not engine.child_of("a")


def test_a_session_joins_a_busy_child_with_room_before_an_idle_one() -> None:
    engine, models = _replica(2, rows=2)
    for s in "abc":
        engine.attach(s)
    busy, idle = engine.child_of("a"), engine.child_of("c")
    engine.detach("c")
    engine.detach("b")
    assert engine.pooled() == [idle]
    engine.attach("d")  # one batched step for a and d, not a second child stepping
    assert engine.child_of("d") is busy
    assert engine.pooled() == [idle]
    assert len(models) == 2


def test_idle_children_return_to_the_pool_and_are_reused() -> None:
    engine, models = _replica(2)
    engine.attach("a")
    engine.attach("b")
    child_a = engine.child_of("a")
    engine.detach("a")
    assert engine.pooled() == [child_a]
    engine.attach("c")
    assert engine.child_of("c") is child_a
    assert len(models) == 2  # no new child was built
    assert engine.pooled() == []


def test_b1_parity_with_a_single_batched_engine() -> None:
    replica, _ = _replica(3)
    single, _ = make_engine(3)
    for e in (replica, single):
        for s in "abc":
            e.attach(s)
    for _ in range(5):
        left = chunks_of(replica.step(list("abc")))
        right = chunks_of(single.step(list("abc")))
        assert left.keys() == right.keys()
        for s in left:
            assert left[s][0] == right[s][0]
            np.testing.assert_array_equal(left[s][1], right[s][1])
    assert [r.session for r in replica.finalize()] == list("abc")


def test_one_failing_child_does_not_starve_the_others() -> None:
    engine, models = _replica(3)
    for s in "abc":
        engine.attach(s)
    engine.step(list("abc"))
    models[1].fail["decode"] = InjectedFailure("b's child broke")
    results = {r.session: r for r in engine.step(list("abc"))}
    assert results["b"].kind is ResultKind.ERROR
    assert "b's child broke" in (results["b"].error or "")
    assert results["a"].kind is results["c"].kind is ResultKind.CHUNK
    models[2].fail["decode"] = InjectedFailure("c's finalize broke")
    final = {r.session: r.kind for r in engine.finalize()}
    assert final == {"a": ResultKind.CHUNK, "c": ResultKind.ERROR}
    # and everybody steps on afterwards
    engine.step(list("abc"))
    results = {r.session: r for r in engine.step(list("abc"))}
    assert all(r.kind is ResultKind.CHUNK for r in results.values())


def test_a_session_whose_seed_fails_fails_alone_and_its_child_serves_on() -> None:
    engine = ReplicaEngine.of_model(lambda: PoisonModel(2), 2, lanes="cpu")
    engine.attach("b")
    engine.step(["b"])
    engine.attach("a", {"prompt": POISON})  # b's child has room: a joins it
    assert engine.child_of("a") is engine.child_of("b")
    chunks = []
    for _ in range(4):
        results = {r.session: r for r in engine.step(["a", "b"])}
        assert results["a"].kind is ResultKind.FAILED  # until it is detached
        chunks.append(results["b"].chunk)
    assert chunks == [0, 1, 2, 3]
    engine.detach("a")
    engine.attach("c")  # into the row a had
    assert engine.child_of("c") is engine.child_of("b")
    assert len(engine.children()) == 1
    engine.close()


def test_a_child_whose_detach_failed_keeps_its_session_and_is_never_pooled() -> None:
    engine, models = _replica(2)
    engine.attach("a")
    engine.attach("b")
    engine.step(["a", "b"])
    models[0].fail["detach"] = InjectedFailure("detach broke")
    bad = engine.child_of("a")
    with pytest.raises(InjectedFailure):
        engine.detach("a")
    assert engine.child_of("a") is bad  # still owned
    engine.detach("a")  # the retry succeeds, yet the child stays out of the pool
    assert bad not in engine.pooled()
    engine.detach("b")
    assert engine.pooled() == [engine.children()[1]]


def test_a_daemon_serves_several_engines_through_one_slab(shm_prefix: str) -> None:
    """``rte serve --engines 2``: a ReplicaEngine of two ComposedEngines, both
    writing into the daemon's slab (its allocator passed on to each child)."""
    d = DaemonProcess(f"{shm_prefix}e", "--model", "null", "--engines", "2", "--max-sessions", "1")
    try:
        with d.client() as client:
            assert client.manifest.max_sessions == 2  # one row in each engine
            client.attach("a")
            client.attach("b")
            with pytest.raises(AdmissionError, match="child engines are full"):
                client.attach("c")
            client.act("a", {"tag": 1})
            client.act("b", {"tag": 2})
            tags: dict[str, int] = {}
            limit = Deadline(what="both engines' chunks, steered")
            while tags != {"a": 1, "b": 2}:
                limit.check(tags)
                chunk = client.poll(timeout=1.0)
                if chunk is not None:
                    with chunk:  # in place, in the daemon's slab
                        assert not chunk.latent.flags.writeable
                        tags[chunk.session] = tag_of(chunk.latent)
    finally:
        assert d.stop() == 0, d.stderr
