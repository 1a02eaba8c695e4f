"""Parking through the serve loop: Suspend, Resume and idle sessions, against a twin.

A session parked by its client (Suspend) or by idleness (``park_idle_s``) stays
attached, its row freed and its state in host memory; resumed, its frames are
those of a twin never parked, chunk index by chunk index (the world model,
pipelined and not, on CPU lanes and the simulated CUDA device; one engine, and
a ReplicaEngine). Every refusal is a notice for its sender and changes nothing:
a model without state, a budget too small, no row free, acting on a suspended
session, resuming one that is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rte import Act, Action, Attach, ComposedEngine, Detach, Notice, NoticeKind, ServeLoop
from rte.models import ReferenceModel
from rte.models.learned import LearnedWorldModel
from rte.protocol.requests import Resume, Suspend
from rte.replica import ReplicaEngine

pytestmark = pytest.mark.usefixtures("each_lanes")

STEPS = 8


def _script(n: int) -> dict[str, Any] | None:
    """The action before a session's ``n``-th step (the same for both twins)."""
    if n == 2:
        return {"move": (1, -1), "prompt": "snow"}
    return {"move": (n % 3 - 1, 1)} if n % 2 else None


def _frames(items: list[Any], into: dict[int, np.ndarray[Any, Any]], session: str = "a") -> None:
    for item in items:
        if getattr(item, "session", None) == session and getattr(item, "has_chunk", False):
            assert item.chunk not in into, item.chunk
            into[item.chunk] = item.latent.copy()


def _kinds(items: list[Any], session: str = "a") -> list[NoticeKind]:
    return [i.kind for i in items if isinstance(i, Notice) and i.session == session]


def _drive(
    loop: ServeLoop, park: Callable[[ServeLoop, int], list[Any]] | None
) -> dict[int, np.ndarray[Any, Any]]:
    """Attach ``a`` (and ``b``, stepped alongside), step ``a`` STEPS times by the
    script; ``park(loop, n)`` before its ``n``-th step parks and resumes it."""
    frames: dict[int, np.ndarray[Any, Any]] = {}
    assert _kinds(loop.handle(Attach("a", {"prompt": "a forest"}, seq=1))) == [NoticeKind.ATTACHED]
    loop.handle(Attach("b", {"prompt": "a desert"}, seq=2))
    for n in range(STEPS):
        if park is not None:
            _frames(park(loop, n), frames)
        action = _script(n)
        if action is not None:
            acted = loop.handle(Act("a", Action(action), seq=10 + n))
            assert NoticeKind.ERROR not in _kinds(acted), acted  # (RESUMED, when idle-parked)
        _frames(loop.step(), frames)
        _settle(loop.engine)
    _frames(loop.handle(Detach("a", seq=99)), frames)
    return frames


def _settle(engine: Any) -> None:
    """Each encode completes within its step: the same in both twins (a prompt's
    encode still under way at a step discards a chunk, by timing)."""
    for child in engine.children() if isinstance(engine, ReplicaEngine) else [engine]:
        child.lanes.drain()


def _world(pipelined: bool) -> ComposedEngine:
    return ComposedEngine(LearnedWorldModel(2, pipelined=pipelined))


def _suspend_at_3(loop: ServeLoop, n: int) -> list[Any]:
    out: list[Any] = []
    if n == 3:
        out = loop.handle(Suspend("a", seq=50))
        assert _kinds(out) == [NoticeKind.SUSPENDED], out
        assert "a" in loop.parking and loop.parking.nbytes > 0
        for _ in range(3):  # b goes on; a, suspended, is never stepped
            out += loop.step()
            _settle(loop.engine)
        refused = loop.handle(Act("a", Action({"move": (1, 1)}), seq=51))
        assert [(n.kind, n.seq) for n in refused] == [(NoticeKind.ERROR, 51)]
        assert "suspended" in refused[0].message
        back = loop.handle(Resume("a", seq=52))
        assert [(n.kind, n.seq) for n in back] == [(NoticeKind.RESUMED, 52)]
        out += back
    return out


@pytest.mark.parametrize("pipelined", [True, False])
def test_a_suspended_session_resumes_bit_identical_to_its_twin(pipelined: bool) -> None:
    with _world(pipelined) as twin_engine, _world(pipelined) as engine:
        twin = _drive(ServeLoop(twin_engine), None)
        parked = _drive(ServeLoop(engine), _suspend_at_3)
    assert sorted(parked) == sorted(twin) and len(twin) >= STEPS - 1
    for chunk, frame in twin.items():
        np.testing.assert_array_equal(parked[chunk], frame, err_msg=f"chunk {chunk}")


def test_a_replica_engine_suspends_and_resumes_on_a_child_bit_identical() -> None:
    def replica() -> ReplicaEngine:
        return ReplicaEngine.of_model(lambda: LearnedWorldModel(1), 2)

    twin_engine, engine = replica(), replica()
    try:
        assert engine.can_suspend
        twin = _drive(ServeLoop(twin_engine), None)
        parked = _drive(ServeLoop(engine), _suspend_at_3)
    finally:
        twin_engine.close()
        engine.close()
    for chunk, frame in twin.items():
        np.testing.assert_array_equal(parked[chunk], frame, err_msg=f"chunk {chunk}")


def test_a_parked_session_keeps_its_id_and_waits_for_a_row() -> None:
    with _world(True) as engine:
        loop = ServeLoop(engine, admission="rows")
        loop.handle(Attach("a", {}, seq=1))
        loop.handle(Attach("b", {}, seq=2))
        loop.step()
        assert _kinds(loop.handle(Suspend("a", seq=3))) == [NoticeKind.SUSPENDED]
        assert _kinds(loop.handle(Attach("c", {}, seq=4)), "c") == [NoticeKind.ATTACHED]
        again = loop.handle(Attach("a", {}, seq=5))  # still attached: no second row
        assert _kinds(again) == [NoticeKind.ATTACHED] and "a" in loop.parking
        full = loop.handle(Resume("a", seq=6))
        assert [(n.kind, n.seq) for n in full] == [(NoticeKind.REJECTED, 6)]
        assert "stays suspended" in full[0].message and "a" in loop.parking
        assert loop.sessions == ["a", "b", "c"]
        assert {r.session for r in loop.step()} <= {"b", "c"}  # a is not stepped
        loop.handle(Detach("c", seq=7))
        assert _kinds(loop.handle(Resume("a", seq=8))) == [NoticeKind.RESUMED]
        assert "a" in engine.sessions()


def test_detaching_a_parked_session_drops_its_state() -> None:
    with _world(True) as engine:
        loop = ServeLoop(engine)
        loop.handle(Attach("a", {}, seq=1))
        loop.step()
        loop.handle(Suspend("a", seq=2))
        out = loop.handle(Detach("a", seq=3))
        assert [(n.kind, n.seq) for n in out] == [(NoticeKind.DETACHED, 3)]
        assert loop.parking.nbytes == 0 and loop.sessions == [] and engine.sessions() == {}
        again = loop.handle(Resume("a", seq=4))
        assert [(n.kind, n.seq) for n in again] == [(NoticeKind.ERROR, 4)]


class Stateless(ReferenceModel):
    """A model that exports no state."""

    def state_identity(self) -> None:
        return None


def test_refusals_change_nothing() -> None:
    with ComposedEngine(Stateless(2)) as engine:
        loop = ServeLoop(engine)
        loop.handle(Attach("a", {}, seq=1))
        out = loop.handle(Suspend("a", seq=2))
        assert [(n.kind, n.seq) for n in out] == [(NoticeKind.ERROR, 2)]
        assert "StateError" in out[0].message and "can_suspend" in out[0].message
        assert "a" in engine.sessions() and "a" not in loop.parking
        resume = loop.handle(Resume("a", seq=3))
        assert "not suspended" in resume[0].message
    with _world(True) as engine:
        loop = ServeLoop(engine, park_bytes=1)  # no state fits
        loop.handle(Attach("a", {}, seq=1))
        loop.step()
        out = loop.handle(Suspend("a", seq=2))
        assert [(n.kind, n.seq) for n in out] == [(NoticeKind.REJECTED, 2)]
        assert "--park-bytes" in out[0].message and "a" in engine.sessions()
        assert [r.chunk for r in loop.step() if r.session == "a"] == [0]  # it goes on
        assert _kinds(loop.handle(Suspend("ghost", seq=3)), "ghost") == [NoticeKind.ERROR]


def test_a_budget_too_small_for_a_state_keeps_frames_identical() -> None:
    def refused(loop: ServeLoop, n: int) -> list[Any]:
        if n == 3:
            assert _kinds(loop.handle(Suspend("a", seq=50))) == [NoticeKind.REJECTED]
        return []

    with _world(True) as twin_engine, _world(True) as engine:
        twin = _drive(ServeLoop(twin_engine), None)
        kept = _drive(ServeLoop(engine, park_bytes=1), refused)
    for chunk, frame in twin.items():
        np.testing.assert_array_equal(kept[chunk], frame, err_msg=f"chunk {chunk}")


def test_an_idle_session_is_parked_and_comes_back_when_due_bit_identical() -> None:
    def idle(loop: ServeLoop, n: int) -> list[Any]:
        out: list[Any] = []
        if n == 3:
            loop.parking.seen_due(["a"], -1e9)  # a was last due long ago
            out = loop.park_idle()
            assert _kinds(out) == [NoticeKind.SUSPENDED] and "idle" in out[0].message
            assert "a" in loop.parking and "a" not in loop.engine.sessions()
            out += loop.step(["b"])  # a is not due: it stays parked
            _settle(loop.engine)
            assert "a" in loop.parking
        return out

    with _world(True) as twin_engine, _world(True) as engine:
        twin = _drive(ServeLoop(twin_engine), None)
        parked = _drive(ServeLoop(engine, park_idle_s=3600.0), idle)  # its next step resumes it
    for chunk, frame in twin.items():
        np.testing.assert_array_equal(parked[chunk], frame, err_msg=f"chunk {chunk}")


def test_idle_parking_holds_more_sessions_than_rows() -> None:
    with ComposedEngine(LearnedWorldModel(1)) as engine:
        loop = ServeLoop(engine, admission="rows", park_idle_s=3600.0)
        loop.handle(Attach("a", {}, seq=1))
        loop.step()
        loop.parking.seen_due(["a"], -1e9)
        assert _kinds(loop.park_idle()) == [NoticeKind.SUSPENDED]
        assert _kinds(loop.handle(Attach("b", {}, seq=2)), "b") == [NoticeKind.ATTACHED]
        assert loop.sessions == ["a", "b"] and engine.sessions() == {"b": 0}
        out = loop.step()  # a is due but no row is free: it stays parked, b steps
        assert "a" in loop.parking and not _kinds(out) and engine.age("b") == 1
        loop.parking.seen_due(["b"], -1e9)
        loop.park_idle()
        acted = loop.handle(Act("a", Action({"move": (1, 0)}), seq=3))  # an action resumes it
        assert _kinds(acted) == [NoticeKind.RESUMED] and engine.sessions() == {"a": 0}
