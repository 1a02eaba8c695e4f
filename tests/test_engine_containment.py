"""Bystanders lose nothing: a session whose own encode or seed fails is detached
alone (a FAILED result, its row freed), and every other session emits every
chunk, in order; conditioning no stage could use is refused at attach and act."""

from __future__ import annotations

from typing import Any

import pytest
from poison_model import POISON, PoisonModel

from probe_model import InjectedFailure, make_engine
from rte import Action, ComposedEngine, ResultKind, UnknownSessionError
from rte.contract import NoticeKind, StepResult
from rte.models import ReferenceModel
from rte.protocol.requests import Act, Attach
from rte.serve import ServeLoop

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams

BAD_TEXT = "x\ud800"  # a lone surrogate: a str, but not valid UTF-8


def _run(
    engine: ComposedEngine,
    due: list[str],
    steps: int,
    actions: dict[str, Action] | None = None,
    gone: set[str] | None = None,
) -> dict[str, list[StepResult]]:
    """Step ``due`` ``steps`` times (``actions`` with the first); every result, by
    session. A session that FAILED joins ``gone`` and is due no more (as a host
    that detaches it)."""
    out: dict[str, list[StepResult]] = {s: [] for s in due}
    gone = set() if gone is None else gone
    for n in range(steps):
        for r in engine.step([s for s in due if s not in gone], actions if n == 0 else None):
            out[r.session].append(r)
            if r.kind is ResultKind.FAILED:
                gone.add(r.session)
    return out


def _chunks(results: list[StepResult]) -> list[int]:
    return [r.chunk for r in results if r.has_chunk]


def _failed(results: list[StepResult]) -> list[StepResult]:
    return [r for r in results if r.kind is ResultKind.FAILED]


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "depth1"])
def test_a_failing_encode_fails_its_session_and_the_bystander_emits_every_chunk(
    pipelined: bool,
) -> None:
    engine, model = make_engine(4, pipelined=pipelined)
    engine.attach("a", {"prompt": "one"})
    engine.attach("b")
    seen = _run(engine, ["a", "b"], 2)
    model.fail["encode_prompt"] = InjectedFailure("encode broke")
    more = _run(engine, ["a", "b"], 1, {"a": Action({"prompt": "two"})})
    engine.lanes.drain()  # the encode has failed: the next step finds it
    rest = _run(engine, ["a", "b"], 8)
    b = seen["b"] + more["b"] + rest["b"]
    assert _chunks(b)[:6] == [0, 1, 2, 3, 4, 5]  # no gap, no repeat
    assert _chunks(b) == list(range(len(_chunks(b))))
    (failure,) = _failed(rest["a"])
    assert "encode" in (failure.error or "") and "encode broke" in (failure.error or "")
    assert rest["a"][-1] is failure
    assert engine.sessions() == {"b": 1}
    engine.attach("c")  # its row is free again
    assert engine.sessions()["c"] == 0
    engine.close()


def test_an_encode_failure_in_a_shared_batch_fails_only_the_session_that_caused_it() -> None:
    model = PoisonModel(4)
    engine = ComposedEngine(model)
    for s in "abc":
        engine.attach(s, {"prompt": "one"})
    _run(engine, ["a", "b", "c"], 2)
    change = {"a": Action({"prompt": POISON}), "b": Action({"prompt": "two"})}
    seen = _run(engine, ["a", "b", "c"], 1, change)  # one encode batch for a and b
    engine.lanes.drain()
    gone: set[str] = set()
    rest = _run(engine, ["a", "b", "c"], 3, gone=gone)
    engine.lanes.drain()  # b's encode, alone this time
    rest2 = _run(engine, ["a", "b", "c"], 4, gone=gone)
    assert [r.session for r in _failed(rest["a"] + rest2["a"])] == ["a"]
    assert not _failed(rest["b"] + rest2["b"] + rest["c"] + rest2["c"])
    assert ("b", "two") in model.encodes  # b's change went through, alone
    c = seen["c"] + rest["c"] + rest2["c"]
    assert _chunks(c) == list(range(1, 1 + len(_chunks(c))))  # every chunk after 0
    b = _chunks(seen["b"] + rest["b"] + rest2["b"])
    assert b == sorted(set(b)) and len(b) >= 3  # b sat out its encode, then went on
    assert set(engine.sessions()) == {"b", "c"}
    engine.close()


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "depth1"])
def test_a_seed_failure_of_one_of_two_arrivals_fails_it_alone(pipelined: bool) -> None:
    model = PoisonModel(4, pipelined=pipelined)
    engine = ComposedEngine(model)
    engine.attach("resident")
    first = _run(engine, ["resident"], 2)
    engine.attach("good", {"prompt": "fine"})
    engine.attach("bad", {"prompt": POISON})  # both pending: one seed for the two
    rest = _run(engine, ["resident", "good", "bad"], 6)
    (failure,) = _failed(rest["bad"])
    assert "seed" in (failure.error or "") and "PoisonFailure" in (failure.error or "")
    assert rest["bad"] == [failure]  # reported in the step that found it
    good = _chunks(rest["good"])
    assert good == list(range(len(good))) and len(good) >= 5  # armed, from chunk 0
    resident = _chunks(first["resident"] + rest["resident"])
    assert resident == list(range(len(resident))) and len(resident) >= 7
    assert set(engine.sessions()) == {"resident", "good"}
    engine.close()


def test_a_lone_arrival_whose_seed_fails_never_stops_the_others() -> None:
    model = PoisonModel(4)
    engine = ComposedEngine(model)
    engine.attach("b")
    _run(engine, ["b"], 1)
    engine.attach("bad", {"prompt": POISON})
    rest = _run(engine, ["b", "bad"], 6)
    assert [r.kind for r in rest["bad"]] == [ResultKind.FAILED]
    assert _chunks(rest["b"]) == [0, 1, 2, 3, 4, 5]
    engine.close()


def test_a_failed_session_not_due_is_told_when_it_next_is_and_can_be_detached() -> None:
    model = PoisonModel(4)
    engine = ComposedEngine(model)
    engine.attach("a")
    engine.attach("b")
    _run(engine, ["a", "b"], 2)
    _run(engine, ["a", "b"], 1, {"a": Action({"prompt": POISON})})
    engine.lanes.drain()
    only_b = _run(engine, ["b"], 2)  # a's failure is found while a is not due
    assert _chunks(only_b["b"]) == [2, 3]
    for _ in range(2):  # failed until detached: every step it is due says so
        (told,) = engine.step(["a"])
        assert told.kind is ResultKind.FAILED and "encode" in (told.error or "")
    with pytest.raises(UnknownSessionError, match="failed"):
        engine.check_action("a", Action({"move": (0, 1)}))
    assert engine.finalize(["a"]) == []
    engine.detach("a")
    with pytest.raises(UnknownSessionError, match="not attached"):
        engine.step(["a"])
    # a host that detaches it before it was ever told: the detach simply completes
    engine.step(["b"], {"b": Action({"prompt": POISON})})
    engine.lanes.drain()
    engine.step([])
    engine.detach("b")
    assert engine.sessions() == {}
    engine.close()


def test_the_serve_loop_turns_a_failure_into_error_and_detached_notices() -> None:
    engine = ComposedEngine(PoisonModel(4))
    loop = ServeLoop(engine)
    loop.handle(Attach("a"))
    loop.handle(Attach("b"))
    for _ in range(2):
        loop.step()
    loop.handle(Act("a", Action({"prompt": POISON})))
    loop.step()
    engine.lanes.drain()
    out = loop.step()
    notices = [(n.session, n.kind) for n in out if not isinstance(n, StepResult)]
    assert notices == [("a", NoticeKind.ERROR), ("a", NoticeKind.DETACHED)]
    assert loop.sessions == ["b"]
    chunks = [r.chunk for _ in range(3) for r in loop.step() if isinstance(r, StepResult)]
    assert chunks == [3, 4, 5]
    engine.close()


# -- conditioning that cannot be used is refused before it reaches a stage ----------


def _models() -> list[Any]:
    models: list[Any] = [ReferenceModel]
    try:
        from rte.models.world import TorchWorldModel  # noqa: PLC0415 (needs torch)
    except ImportError:
        return models
    return [*models, lambda n: TorchWorldModel(n, device="cpu")]


@pytest.mark.parametrize("make", _models(), ids=["reference", "torch"][: len(_models())])
def test_a_prompt_that_is_not_utf8_is_refused_at_attach_and_act(make: Any) -> None:
    engine = ComposedEngine(make(2))
    with pytest.raises(ValueError, match="UTF-8"):
        engine.attach("a", {"prompt": BAD_TEXT})
    assert engine.sessions() == {}
    engine.attach("a", {"prompt": "fine"})
    engine.attach("b")
    with pytest.raises(ValueError, match="UTF-8"):
        engine.check_action("a", Action({"prompt": BAD_TEXT}))
    results = _run(engine, ["a", "b"], 4, {"a": Action({"prompt": BAD_TEXT})})
    assert results["a"][0].kind is ResultKind.ERROR and "UTF-8" in (results["a"][0].error or "")
    for s in "ab":
        chunks = _chunks(results[s])
        assert chunks == list(range(len(chunks))) and len(chunks) >= 2
    engine.close()


def test_a_session_id_that_is_not_utf8_is_refused_at_attach() -> None:
    engine = ComposedEngine(ReferenceModel(2))
    with pytest.raises(ValueError, match="UTF-8"):
        engine.attach(BAD_TEXT)
    assert engine.sessions() == {}
    engine.close()
