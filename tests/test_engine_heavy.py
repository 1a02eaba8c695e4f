"""Bystander isolation: heavy keys go through ENCODE, once per change, off the critical path."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from probe_model import make_engine
from rte import Action, ComposedEngine, Lane, ResultKind, conditioning_equal
from rte.models import ReferenceModel

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams


def _step_until(engine: ComposedEngine, due: list[str], session: str, kind: ResultKind) -> list:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        results = engine.step(due)
        if {r.session: r for r in results}[session].kind is kind:
            return results
        time.sleep(0.001)
    raise AssertionError(f"{session} never reached {kind}")


def test_heavy_change_is_encoded_once_and_the_row_sits_out_then_rejoins() -> None:
    engine, model = make_engine(4)
    engine.attach("a", {"prompt": "forest"})
    engine.attach("b", {"prompt": "desert"})
    engine.step(["a", "b"])
    engine.step(["a", "b"])
    model.encode_gate = threading.Event()
    for _ in range(3):  # the same change, sent repeatedly, is still one change
        results = {r.session: r for r in engine.step(["a", "b"], {"a": Action({"prompt": "city"})})}
        assert results["b"].kind is ResultKind.CHUNK
    assert results["a"].kind is ResultKind.ENCODING
    age = engine.age("a")
    model.encode_gate.set()
    _step_until(engine, ["a", "b"], "a", ResultKind.WARMUP)  # rejoined: generating again
    assert engine.age("a") == age + 1
    assert model.encodes == [("a", "city")]
    encode_calls = [c for c in model.calls if c.name == "encode_prompt"]
    assert [(c.lane, c.sessions) for c in encode_calls] == [(Lane.ENCODE, ("a",))]
    # setting the value it already has is no change at all
    engine.step(["a", "b"], {"a": Action({"prompt": "city"}), "b": Action({"prompt": "desert"})})
    engine.step(["a", "b"])
    assert model.encodes == [("a", "city")]
    engine.close()


def test_changed_rows_are_batched_into_one_encode() -> None:
    engine, model = make_engine(4)
    for s in "abc":
        engine.attach(s, {"prompt": "start"})
    engine.step(list("abc"))
    actions = {"a": Action({"prompt": "x"}), "c": Action({"prompt": "y"})}
    engine.step(list("abc"), actions)
    engine.lanes.drain()
    encode_calls = [c for c in model.calls if c.name == "encode_prompt"]
    assert [c.sessions for c in encode_calls] == [("a", "c")]
    engine.close()


def test_new_prompt_is_applied_after_rejoin() -> None:
    def run(change: bool) -> np.ndarray:
        engine, _ = make_engine(2)
        engine.attach("a", {"prompt": "one"})
        engine.step(["a"])
        if change:
            engine.step(["a"], {"a": Action({"prompt": "two"})})
            engine.lanes.drain()
        results = [engine.step(["a"]) for _ in range(3)]
        engine.close()
        return results[-1][0].latent.copy()

    assert not np.array_equal(run(False), run(True))


def test_over_budget_encode_never_holds_back_ready_rows() -> None:
    engine, model = make_engine(4)
    engine.attach("slow", {"prompt": "a"})
    engine.attach("fast", {"prompt": "b"})
    engine.step(["slow", "fast"])
    model.encode_gate = threading.Event()  # the encode cannot finish until we say so
    engine.step(["slow", "fast"], {"slow": Action({"prompt": "huge"})})
    fast_chunks = []
    for _ in range(10):
        results = {r.session: r for r in engine.step(["slow", "fast"])}
        assert results["slow"].kind is ResultKind.ENCODING
        assert results["fast"].kind is ResultKind.CHUNK
        fast_chunks.append(results["fast"].chunk)
    assert fast_chunks == list(range(1, 11))
    model.encode_gate.set()
    _step_until(engine, ["slow", "fast"], "slow", ResultKind.WARMUP)
    engine.close()


def test_numpy_conditioning_equality_decides_what_is_a_change() -> None:
    engine, model = make_engine(2, extra_heavy=frozenset({"image"}))
    image = np.arange(12, dtype=np.float32).reshape(3, 4)
    engine.attach("a", {"image": image, "meta": {"tags": ["x"]}})
    engine.step(["a"])
    engine.step(["a"], {"a": Action({"image": image.copy()})})  # equal contents: no change
    engine.lanes.drain()
    engine.step(["a"])
    assert model.heavy_seen == []
    changed = image.copy()
    changed[1, 2] = -1
    engine.step(["a"], {"a": Action({"image": changed})})
    engine.lanes.drain()
    assert len(model.heavy_seen) == 1
    np.testing.assert_array_equal(model.heavy_seen[0][2], changed)
    engine.close()


def test_a_model_can_supply_heavy_equal() -> None:
    class CaseBlind(ReferenceModel):
        def heavy_equal(self, key: str, a: object, b: object) -> bool:
            return str(a).lower() == str(b).lower()

    model = CaseBlind(2)
    engine = ComposedEngine(model)
    engine.attach("a", {"prompt": "Cat"})
    engine.step(["a"])
    engine.step(["a"], {"a": Action({"prompt": "CAT"})})
    engine.lanes.drain()
    assert model.encodes == []
    engine.step(["a"], {"a": Action({"prompt": "dog"})})
    engine.lanes.drain()
    assert model.encodes == [("a", "dog")]
    engine.close()


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (np.zeros(3), np.zeros(3), True),
        (np.zeros(3), np.zeros(4), False),
        (np.zeros(3, np.float32), np.zeros(3, np.float64), False),
        (np.zeros(3), [0.0, 0.0, 0.0], False),
        ({"k": [np.ones(2), (1, "x")]}, {"k": [np.ones(2), (1, "x")]}, True),
        ({"k": [np.ones(2), (1, "x")]}, {"k": [np.ones(2), (1, "y")]}, False),
        ({"k": 1}, {"k": 1, "j": 2}, False),
        ([1, 2], (1, 2), False),
        (np.float32(1.5), 1.5, True),
        (float("nan"), float("nan"), False),
        ("a", "a", True),
        (None, None, True),
    ],
)
def test_conditioning_equal(a: object, b: object, equal: bool) -> None:
    assert conditioning_equal(a, b) is equal
    assert conditioning_equal(b, a) is equal
