"""Arena: lowest free row, admission, idempotent attach, row reuse."""

from __future__ import annotations

import pytest

from probe_model import make_engine
from rte import Action, AdmissionError, EngineClosedError, ResultKind, UnknownSessionError

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams


def test_attach_takes_lowest_free_row_and_reuses_freed_rows() -> None:
    engine, _ = make_engine(4)
    for s in "abcd":
        engine.attach(s)
    assert engine.sessions() == {"a": 0, "b": 1, "c": 2, "d": 3}
    engine.detach("b")
    engine.detach("a")
    engine.attach("e")
    engine.attach("f")
    assert engine.sessions()["e"] == 0
    assert engine.sessions()["f"] == 1
    engine.close()


def test_attach_beyond_capacity_raises_admission_error_and_changes_nothing() -> None:
    engine, _ = make_engine(2)
    engine.attach("a")
    engine.attach("b")
    with pytest.raises(AdmissionError, match="all 2 rows are in use"):
        engine.attach("c")
    assert engine.sessions() == {"a": 0, "b": 1}
    engine.detach("a")
    engine.attach("c")  # room again after a detach
    assert engine.sessions() == {"c": 0, "b": 1}
    engine.close()


def test_reattach_is_a_noop_and_keeps_the_stream() -> None:
    engine, model = make_engine(2)
    engine.attach("a", {"prompt": "x"})
    engine.step(["a"])
    engine.step(["a"])
    engine.attach("a", {"prompt": "something else"})
    assert engine.sessions() == {"a": 0}
    assert engine.age("a") == 2
    (result,) = engine.step(["a"])
    assert result.kind is ResultKind.CHUNK and result.chunk == 1
    assert model.names().count("seed") == 1
    engine.close()


def test_unknown_sessions_are_refused_by_every_call() -> None:
    engine, _ = make_engine(2)
    engine.attach("a")
    with pytest.raises(UnknownSessionError, match="'ghost'"):
        engine.detach("ghost")
    with pytest.raises(UnknownSessionError):
        engine.step(["a", "ghost"])
    with pytest.raises(UnknownSessionError):
        engine.finalize(["ghost"])
    assert engine.age("a") == 0  # the refused step did nothing
    engine.close()
    with pytest.raises(EngineClosedError):
        engine.step(["a"])


def test_malformed_conditioning_is_refused_for_its_session_only() -> None:
    engine, _ = make_engine(2)
    with pytest.raises(ValueError, match="move must be two ints"):
        engine.attach("bad", {"move": "left"})
    assert engine.sessions() == {}
    engine.attach("a")
    engine.attach("b")
    engine.step(["a", "b"])
    results = engine.step(["a", "b"], {"a": Action({"prompt": 42})})
    by = {r.session: r for r in results}
    assert by["a"].kind is ResultKind.ERROR and "prompt must be a str" in (by["a"].error or "")
    assert by["b"].kind is ResultKind.CHUNK
    # a's in-flight chunk was not lost: it comes out on its next step
    (again,) = engine.step(["a"])
    assert again.kind is ResultKind.CHUNK and again.chunk == 0
    engine.close()
