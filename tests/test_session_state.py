"""Suspend and resume: a session's state out of its engine and back, bit-identical to a twin.

A session suspended at a chunk boundary and resumed (in its engine, or in a
fresh one: a migration), its state through bytes or not, goes on at its next
chunk index, and every frame it makes is the frame of a twin that was never
suspended: pipelined and not, with a heavy encode in flight, on CPU lanes and
on the simulated CUDA device, for every shipped model. A state that does not
belong (another model, configuration, version or session; torn or garbled
bytes) is refused with a StateError, and nothing changes.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from probe_model import ProbeModel
from rte import Action, AdmissionError, ComposedEngine, RequestError, ResultKind
from rte.errors import StateError, UnknownSessionError
from rte.models import NullModel, ReferenceModel
from rte.models.learned import LearnedWorldModel
from rte.stages import StageModel
from rte.state import SessionState

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams

STEPS = 9
SUSPEND_AT = 4  # after this many steps


def _torch_world(pipelined: bool) -> StageModel:
    pytest.importorskip("torch", reason="needs the torch extra")
    from rte.models.world import TorchWorldModel  # noqa: PLC0415

    return TorchWorldModel(4, pipelined=pipelined, device="cpu")


def _torch_learned(pipelined: bool) -> StageModel:
    pytest.importorskip("torch", reason="needs the torch extra")
    from rte.models.learned_torch import TorchLearnedWorld  # noqa: PLC0415

    return TorchLearnedWorld(4, pipelined=pipelined, device="cpu")


MODELS: dict[str, Callable[[bool], StageModel]] = {
    "reference": lambda pipelined: ReferenceModel(4, pipelined=pipelined),
    "null": lambda pipelined: NullModel(4, pipelined=pipelined),
    "world": lambda pipelined: LearnedWorldModel(4, pipelined=pipelined),
    "torch": _torch_world,
    "world-torch": _torch_learned,
}


def _action(model: StageModel, session: str, age: int) -> Action | None:
    """The script both twins follow, by the session's chunk index (so the same action
    meets the same chunk in both): a move now and then (it persists), a new prompt once."""
    if isinstance(model, NullModel):
        return Action({"tag": age * 7}) if age % 3 == 1 and session == "a" else None
    if age == SUSPEND_AT - 1:  # the last action before the suspend applies after it too
        prompt = "snow" if session == "a" else "a forest at night"
        return Action({"move": (1, -1), "prompt": prompt})
    return Action({"move": (age % 3 - 1, 1)}) if age % 2 and session == "a" else None


def _frames(results: list[Any], into: dict[str, dict[int, np.ndarray]]) -> None:
    for r in results:
        if r.has_chunk:
            assert r.chunk not in into.setdefault(r.session, {}), (r.session, r.chunk)
            into[r.session][r.chunk] = r.latent.copy()


def _run(
    make: Callable[[], StageModel],
    *,
    suspend: str | None,
    through_bytes: bool,
    elsewhere: bool,
    together: bool = False,
) -> dict[str, dict[int, np.ndarray]]:
    """Each session's frames by chunk index over the script; ``suspend``: that session
    is suspended after SUSPEND_AT steps, sits out two, and is resumed (in a fresh
    engine when ``elsewhere``, its bystander following it there; ``together``: both
    taken out in one ``suspend_many``, as a checkpoint of many takes them)."""
    model = make()
    engine = ComposedEngine(model)
    prompts = {"a": "a meadow", "b": "a desert"}
    for s, prompt in prompts.items():
        engine.attach(s, {} if isinstance(model, NullModel) else {"prompt": prompt})
    frames: dict[str, dict[int, np.ndarray]] = {}
    parked: dict[str, Any] = {}
    for step in range(STEPS):
        if suspend and step == SUSPEND_AT:
            moving = ["a", "b"] if elsewhere or together else [suspend]
            taken = engine.suspend_many(moving) if together else {}
            for s in moving:
                state = taken[s] if together else engine.suspend(s)
                parked[s] = SessionState.from_bytes(state.to_bytes()) if through_bytes else state
            if elsewhere:
                engine.close()
                engine = ComposedEngine(make())
        if suspend and step == SUSPEND_AT + 2:
            for s, state in parked.items():
                engine.resume(s, state)
        due = list(engine.sessions())
        actions = {s: a for s in due if (a := _action(model, s, engine.age(s))) is not None}
        _frames(engine.step(due, actions), frames)
        engine.lanes.drain()  # each encode completes within its step: the same in both runs
    _frames(engine.finalize(), frames)
    engine.close()
    return frames


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "flat"])
@pytest.mark.parametrize("name", list(MODELS))
def test_a_resumed_session_makes_the_frames_of_its_never_suspended_twin(
    name: str, pipelined: bool
) -> None:
    def make() -> StageModel:
        return MODELS[name](pipelined)

    twin = _run(make, suspend=None, through_bytes=False, elsewhere=False)
    assert len(twin["a"]) >= STEPS - 1  # (its prompt's encode sits out one step)
    for through_bytes, elsewhere in ((False, False), (True, True)):
        resumed = _run(make, suspend="a", through_bytes=through_bytes, elsewhere=elsewhere)
        for s in ("a", "b"):
            made = resumed[s]
            assert sorted(made) == list(range(len(made))), (s, sorted(made))  # no gap, no repeat
            for chunk, frame in made.items():
                meant = slice(0, 8) if name == "null" else slice(None)  # (the rest: np.empty's)
                assert np.array_equal(frame[meant], twin[s][chunk][meant]), (name, s, chunk)
        assert len(resumed["a"]) == len(twin["a"]) - 2  # it sat out two steps
    if name != "null":
        assert not np.array_equal(twin["a"][3], twin["b"][3])


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "flat"])
@pytest.mark.parametrize("name", ["reference", "world"])
def test_sessions_taken_out_together_make_the_frames_of_their_twins(
    name: str, pipelined: bool
) -> None:
    """``suspend_many`` (a checkpoint of many sessions: one export, one decode of
    their chunks in flight) gives each the state its own ``suspend`` would."""

    def make() -> StageModel:
        return MODELS[name](pipelined)

    twin = _run(make, suspend=None, through_bytes=False, elsewhere=False)
    for elsewhere in (False, True):
        resumed = _run(make, suspend="a", through_bytes=True, elsewhere=elsewhere, together=True)
        for s in ("a", "b"):
            made = resumed[s]
            assert sorted(made) == list(range(len(made))), (s, sorted(made))
            assert len(made) == len(twin[s]) - 2, (s, sorted(made))  # both sat out two steps
            for chunk, frame in made.items():
                assert np.array_equal(frame, twin[s][chunk]), (name, s, chunk, elsewhere)


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "flat"])
def test_a_suspend_with_a_heavy_encode_in_flight_waits_for_it_and_keeps_its_result(
    pipelined: bool,
) -> None:
    def run(suspend: bool) -> dict[int, np.ndarray]:
        model = ProbeModel(4, pipelined=pipelined)
        engine = ComposedEngine(model)
        engine.attach("a", {"prompt": "one"})
        engine.attach("b", {"prompt": "two"})
        frames: dict[str, dict[int, np.ndarray]] = {}
        for _ in range(3):
            _frames(engine.step(["a", "b"]), frames)
        model.encode_gate = threading.Event()
        results = engine.step(["a", "b"], {"a": Action({"prompt": "three"})})
        _frames(results, frames)
        assert {r.session: r.kind for r in results}["a"] is not ResultKind.CHUNK or pipelined
        if suspend:
            opener = threading.Timer(0.05, model.encode_gate.set)  # opens while suspend waits
            opener.start()
            state = engine.suspend("a")  # waits for the encode, never reads it half done
            opener.join(10)
            assert state.conditioning["prompt"] == "three"
            engine.close()
            engine = ComposedEngine(ProbeModel(4, pipelined=pipelined))
            engine.resume("a", SessionState.from_bytes(state.to_bytes()))
        else:
            model.encode_gate.set()
        for _ in range(12):
            _frames(engine.step(["a"]), frames)
            engine.lanes.drain()
        _frames(engine.finalize(), frames)
        engine.close()
        return frames["a"]

    twin, resumed = run(False), run(True)  # (each sat out its encode for its own time)
    for made in (twin, resumed):
        assert len(made) >= 10 and sorted(made) == list(range(len(made)))
    for chunk in range(min(len(twin), len(resumed))):
        assert np.array_equal(resumed[chunk], twin[chunk]), chunk


def test_the_chunk_in_flight_at_a_suspend_is_emitted_by_the_next_step_after_resume() -> None:
    engine = ComposedEngine(ReferenceModel(2))
    engine.attach("a")
    engine.step(["a"])
    engine.step(["a"])  # chunk 0 emitted, chunk 1 in flight
    state = engine.suspend("a")
    assert state.chunk == 2 and len(state.pending) == 1 and engine.sessions() == {}
    engine.resume("a", state)
    assert engine.age("a") == 2
    (r,) = engine.step(["a"])
    assert (r.kind, r.chunk) == (ResultKind.CHUNK, 1)
    np.testing.assert_array_equal(r.latent, state.pending[0])
    engine.close()


def test_a_session_not_yet_seeded_resumes_pending_and_is_seeded_then() -> None:
    engine = ComposedEngine(ProbeModel(4, need_pending=2))
    engine.attach("a", {"prompt": "x"})
    assert engine.step(["a"])[0].kind is ResultKind.PENDING
    state = engine.suspend("a")
    assert not state.armed and state.row is None and state.chunk == 0
    engine.resume("a", SessionState.from_bytes(state.to_bytes()))
    engine.attach("b")
    engine.step(["a", "b"])
    engine.step(["a", "b"])
    assert engine.age("a") == 2
    engine.close()


def test_refusals_say_why_and_change_nothing() -> None:
    engine = ComposedEngine(ReferenceModel(2))
    assert engine.can_suspend
    with pytest.raises(UnknownSessionError, match="'ghost' is not attached"):
        engine.suspend("ghost")
    engine.attach("a")
    engine.step(["a"])
    state = engine.suspend("a")
    engine.resume("a", state)
    with pytest.raises(RequestError, match="it is attached"):  # resumed twice
        engine.resume("a", state)
    engine.attach("b")
    engine.step(["a", "b"])
    other = engine.suspend("b")  # its chunk 0 in flight
    engine.attach("c")
    with pytest.raises(AdmissionError, match="all 2 rows are in use"):
        engine.resume("b", other)
    null_state = _null_state()
    fresh = ComposedEngine(ReferenceModel(2))
    with pytest.raises(StateError, match="session 'b''s"):
        fresh.resume("x", other)
    with pytest.raises(StateError, match="a state of null"):
        fresh.resume("n", null_state)
    scaled = ComposedEngine(ReferenceModel(2, scale=2))
    with pytest.raises(StateError, match="a state of reference"):  # another configuration
        scaled.resume("b", other)
    newer = dataclasses.replace(other, model=dataclasses.replace(other.model, version=2))
    with pytest.raises(StateError, match="state v2"):
        fresh.resume("b", newer)
    flat = ComposedEngine(ReferenceModel(2, pipelined=False))
    with pytest.raises(StateError, match="this engine holds none"):
        flat.resume("b", other)
    assert fresh.sessions() == {}  # nothing was taken by any refusal
    fresh.resume("b", other)
    assert fresh.sessions() == {"b": 0}
    assert [r.kind for r in engine.step(["a", "c"])] == [ResultKind.CHUNK, ResultKind.WARMUP]
    for e in (engine, fresh, scaled, flat):
        e.close()


def _null_state() -> SessionState:
    engine = ComposedEngine(NullModel(2))
    engine.attach("n")
    engine.step(["n"])
    state = engine.suspend("n")
    engine.close()
    return state


def test_bytes_that_are_not_a_state_are_refused_saying_which_check_failed() -> None:
    engine = ComposedEngine(ReferenceModel(2))
    frame = np.arange(64 * 64 * 3, dtype=np.uint8).reshape(64, 64, 3)
    engine.attach("a", {"prompt": "p", "move": (1, 2), "frame": frame})
    engine.step(["a"])
    state = dataclasses.replace(engine.suspend("a"), host={"applied": 7, "credits": [1, 2]})
    data = state.to_bytes()
    back = SessionState.from_bytes(data)
    assert back.conditioning["move"] == (1, 2) and back.host == {"applied": 7, "credits": (1, 2)}
    np.testing.assert_array_equal(back.conditioning["frame"], frame)
    assert back.nbytes == state.nbytes > 0 and back.model == state.model
    garbled = bytearray(data)
    garbled[-100] ^= 0xFF
    cases = {
        "torn": data[: len(data) - 10],
        "garbled": bytes(garbled),
        "first bytes": b"X" + data[1:],
        "less than its header": data[:10],
        "of format 9": data[:8] + (9).to_bytes(4, "little") + data[12:],
    }
    for why, bad in cases.items():
        with pytest.raises(StateError, match=why):
            SessionState.from_bytes(bad)
    engine.resume("a", back)
    engine.close()


class Stateless(ReferenceModel):
    """A model that does not export its rows (the capability's default)."""

    def state_identity(self) -> None:
        return None


def test_a_model_without_the_capability_says_so_and_keeps_the_session() -> None:
    engine = ComposedEngine(Stateless(2))
    assert not engine.can_suspend
    engine.attach("a")
    engine.step(["a"])
    with pytest.raises(StateError, match="cannot be suspended: Stateless does not export"):
        engine.suspend("a")
    assert engine.sessions() == {"a": 0}
    (r,) = engine.step(["a"])
    assert (r.kind, r.chunk) == (ResultKind.CHUNK, 0)
    engine.close()
