"""The host half of a session's state: what its serving loop kept moves with it.

A session that moves (``export`` then ``attach(s, state=...)``: a migrate, a
drain; a pool's reattach from a dead member's checkpoint) takes along what its
serving loop kept for it beside its engine state (:class:`rte.state.HostHalf`):
its priority, the actions queued for its next step and their seq, and its
receipts. An action sent just before the move applies on the new host at the
chunk it would have on the old one, so the moved session's frames, and the
``applied`` seq of each chunk, are those of a twin never moved. A malformed host
half is refused with a StateError naming the field, and loads nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import test_checkpoint_recovery
import test_migrate
from daemon_harness import DaemonProcess, Deadline
from session_frames import frames_until
from test_checkpoint_recovery import frames_of

from rte import ComposedEngine, RequestError, StateError
from rte.client import PoolClient, connect_pool
from rte.contract import Action, NoticeKind, StepResult
from rte.ipc.checkpoints import read_checkpoint
from rte.models import ReferenceModel, load_model
from rte.overload import DEFAULT_PRIORITY
from rte.protocol.requests import Act, Attach, Export, Resume, StateBox, Suspend, with_state
from rte.serve import ServeLoop
from rte.state import HostHalf, SessionState

pair = test_migrate.pair  # two paced reference daemons, one row each
daemons = test_checkpoint_recovery.daemons  # two world daemons checkpointing every 3 chunks

MOVE = {"move": (1, -1)}  # a light action: it shows from the chunk it applies to


class Run:
    """One session ``a`` served by a ServeLoop of this process: its frames and the
    ``applied`` of each, by chunk index."""

    def __init__(self, pipelined: bool, attach: Attach | None = None) -> None:
        self.engine = ComposedEngine(ReferenceModel(2, pipelined=pipelined))
        self.loop = ServeLoop(self.engine)
        self.frames: dict[int, np.ndarray[Any, Any]] = {}
        self.applied: dict[int, int] = {}
        self.answers = self.loop.handle(attach or Attach("a", {"prompt": "forest"}, seq=1))

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            self.take(self.loop.step())

    def take(self, items: list[Any]) -> None:
        for r in items:
            if isinstance(r, StepResult) and r.has_chunk:
                assert r.chunk not in self.frames, f"chunk {r.chunk} came twice"
                self.frames[r.chunk], self.applied[r.chunk] = r.latent.copy(), r.applied

    def export(self) -> SessionState:
        box = StateBox()
        answers = self.loop.handle(Export("a", seq=99, into=box))
        assert [n.kind for n in answers][-1] is NoticeKind.EXPORTED, answers
        assert box.state is not None
        return SessionState.from_bytes(box.state.to_bytes())  # as it travels

    def close(self) -> None:
        self.engine.close()


def _same(moved: dict[int, Any], twin: dict[int, Any], what: str) -> None:
    assert sorted(moved) == list(range(len(moved))), f"a gap in the {what}: {sorted(moved)}"
    for index, value in moved.items():
        np.testing.assert_array_equal(value, twin[index], err_msg=f"{what} of chunk {index}")


# -- in process: the serve loop ------------------------------------------------


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "flat"])
def test_an_action_queued_at_an_export_applies_where_it_moves_at_its_chunk(
    pipelined: bool,
) -> None:
    """One action handed to the engine before the export (its receipt not yet on a
    chunk: pipelined, its chunk is in flight) and one still queued when it leaves:
    moved to another loop, the session's frames and receipts are the twin's."""
    twin, old = Run(pipelined), Run(pipelined)
    for run in (twin, old):
        run.step(3)
        run.loop.handle(Act("a", Action({"move": (0, 1)}), seq=5))
        run.step(1)  # (handed: applied from the chunk this step made)
        run.loop.handle(Act("a", Action(MOVE), seq=7))  # queued, not yet stepped
    twin.step(8)
    state = old.export()
    assert state.host["actions"] == MOVE and state.host["act_seq"] == 7, state.host
    new = Run(pipelined, Attach("a", with_state({}, state), seq=2))
    assert new.answers[0].kind is NoticeKind.ATTACHED, new.answers
    new.step(8)
    frames, applied = {**old.frames, **new.frames}, {**old.applied, **new.applied}
    _same(frames, twin.frames, "frames")
    _same(applied, twin.applied, "receipts")
    assert 7 in applied.values(), "the action queued at the export was lost"
    for run in (twin, old, new):
        run.close()


def test_a_priority_moves_with_its_session_unless_the_attach_names_another() -> None:
    old = Run(True, Attach("a", {"prompt": "forest"}, seq=1, priority=3))
    old.step(2)
    state = old.export()
    assert state.host["priority"] == 3
    kept = Run(True, Attach("a", with_state({}, state), seq=2))  # (the default: the state's)
    assert kept.loop.governor.priority["a"] == 3
    named = Run(True, Attach("a", with_state({}, state), seq=2, priority=0))
    assert named.loop.governor.priority["a"] == 0  # the attach's own class wins
    for run in (old, kept, named):
        run.close()


def test_a_session_its_client_suspended_moves_in_suspended_and_resumes_as_its_twin() -> None:
    """Suspended, then exported: it moves in suspended (no chunk until its client
    resumes it), and once resumed its frames are the twin's."""
    twin, old = Run(True), Run(True)
    twin.step(6)
    old.step(3)
    old.loop.handle(Suspend("a", seq=3))
    state = old.export()
    assert state.host.get("suspended") is True, state.host
    new = Run(True, Attach("a", with_state({}, state), seq=2))
    kinds = [n.kind for n in new.answers]
    assert kinds == [NoticeKind.ATTACHED, NoticeKind.SUSPENDED], new.answers
    new.step(2)
    assert not new.frames, "a suspended session streamed where it moved"
    resumed = new.loop.handle(Resume("a", seq=4))
    assert [n.kind for n in resumed] == [NoticeKind.RESUMED], resumed
    new.step(3)
    _same({**old.frames, **new.frames}, twin.frames, "frames")
    for run in (twin, old, new):
        run.close()


MALFORMED = {
    "priority": ({"priority": 7}, "host.priority"),
    "priority-type": ({"priority": "high"}, "host.priority"),
    "unknown-key": ({"credits": 4}, "unknown key"),
    "actions-type": ({"actions": [1, 2]}, "host.actions"),
    "actions-key": ({"actions": {"warp": 9}}, "host.actions"),
    "actions-value": ({"actions": {"move": "north"}}, "host.actions"),
    "seq": ({"act_seq": -1}, "host.act_seq"),
    "applied": ({"applied": 1.5}, "host.applied"),
    "marks": ({"marks": [[3]]}, "host.marks"),
    "suspended": ({"suspended": "yes"}, "host.suspended"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_host_half_is_refused_naming_its_field_and_loads_nothing(case: str) -> None:
    host, field = MALFORMED[case]
    old = Run(True)
    old.step(3)
    state = old.export()
    bad = dataclasses.replace(state, host={**state.host, **host})
    there = Run(True, Attach("a", with_state({}, bad), seq=2))
    (refused,) = there.answers
    assert refused.kind is NoticeKind.ERROR and "StateError" in refused.message, refused
    assert field in refused.message, refused.message
    assert there.loop.sessions == [] and there.engine.sessions() == {}, "something was loaded"
    there.take(there.loop.handle(Attach("a", with_state({}, state), seq=3)))  # nothing lost
    there.step(2)
    first = state.chunk - len(state.pending)
    assert sorted(there.frames) == [first, first + 1], (first, sorted(there.frames))
    for run in (old, there):
        run.close()


def test_a_host_half_reads_back_what_it_wrote_and_an_empty_one_is_none() -> None:
    for half in (HostHalf(2, {"move": (1, 0)}, 9, 4, ((6, 9),)), HostHalf(suspended=True)):
        assert HostHalf.of(half.to_value()) == half
    assert HostHalf.of({}) == HostHalf()  # (a state of an engine alone: ComposedEngine.suspend)
    with pytest.raises(StateError, match="not a map"):
        HostHalf.of([1])


# -- through real daemons --------------------------------------------------------


def _twin_with(seq: int, at: int, until: int) -> tuple[dict[int, Any], dict[int, int]]:
    """Session ``a`` never moved (a ServeLoop of this process), acted on with ``MOVE``
    (seq ``seq``) just before the step that makes chunk ``at``."""
    twin = Run(ReferenceModel().pipelined)
    limit = Deadline(what="the twin's chunks")
    while twin.engine.age("a") < at:
        limit.check(twin.engine.age("a"))
        twin.step()
    twin.loop.handle(Act("a", Action(MOVE), seq=seq))
    while until not in twin.frames:
        limit.check(sorted(twin.frames))
        twin.step()
    twin.close()
    return twin.frames, twin.applied


def test_an_action_sent_just_before_a_migrate_applies_on_the_new_daemon_at_its_chunk(
    pair: list[DaemonProcess],
) -> None:
    """The session holds its one credit (its daemon steps it no more), is acted on
    and migrated at once: the action was queued on the old daemon when it left. It
    applies on the new one at the chunk it would have there, each chunk's
    ``applied`` says so, and every frame is the twin's."""
    held_at, until = 4, 14
    frames: dict[int, Any] = {}
    applied: dict[int, int] = {}
    held = None
    with connect_pool([d.name for d in pair], timeout=30) as client:
        client.attach("a", {"prompt": "forest"}, credits=1)
        to = next(d.name for d in pair if d.name != client.home["a"])
        limit = Deadline(what="the chunks before the move")
        while held_at not in frames:
            limit.check(sorted(frames))
            chunk = client.poll(timeout=1.0)
            if chunk is None:
                continue
            frames[chunk.chunk], applied[chunk.chunk] = chunk.latent.copy(), chunk.applied
            if chunk.chunk < held_at:
                chunk.release()
            else:
                held = chunk  # its credit held: the old daemon steps it no further
        seq = client.act("a", MOVE)
        assert client.migrate("a", to=to) == to
        assert held is not None
        held.release()
        frames_until(client, frames, until, applied, what="the chunks after the move")
        at = held_at + 1 + int(client.manifest.pipelined)  # the first chunk not yet made
    assert applied[until] == seq, (
        f"the action (seq {seq}) sent before the migrate was never applied: {applied}"
    )
    assert min(c for c, s in applied.items() if s == seq) == at, applied
    twin_frames, twin_applied = _twin_with(seq, at, until)
    _same(applied, twin_applied, "receipts")
    _same(frames, twin_frames, "frames")


def test_a_priority_survives_a_migrate(pair: list[DaemonProcess]) -> None:
    with connect_pool([d.name for d in pair], timeout=30) as client:
        client.attach("a", {"prompt": "forest"}, priority=3)
        to = next(d.name for d in pair if d.name != client.home["a"])
        assert client.migrate("a", to=to) == to
        state = client.export("a")  # (what the new daemon's loop holds for it)
    assert state.host.get("priority") == 3, state.host


def test_a_malformed_host_half_is_refused_by_a_daemon_and_the_state_still_moves(
    pair: list[DaemonProcess],
) -> None:
    with connect_pool([d.name for d in pair], timeout=30) as client:
        client.attach("a", {"prompt": "forest"})
        to = next(d.name for d in pair if d.name != client.home["a"])
        assert client.migrate("a", to=to) == to
        state = client.export("a")  # (its host half from the daemon it moved to)
        bad = dataclasses.replace(state, host={**state.host, "priority": 9})
        with pytest.raises(RequestError, match=r"host\.priority must be a whole number 0 to 3"):
            client.attach("a", state=bad)
        assert client.sessions == set()
        client.attach("a", state=state)  # nothing was lost
        assert client.sessions == {"a"}


def test_a_priority_survives_a_checkpoint_recovery(daemons: list[DaemonProcess]) -> None:
    """SIGKILL of the member streaming ``a`` (priority 0): reattached on the survivor
    from its checkpoint, it keeps its class there."""
    names = [d.name for d in daemons]
    with connect_pool(names, timeout=30, reattach=True, recover=read_checkpoint) as client:
        client.attach("a", {}, priority=0)
        assert DEFAULT_PRIORITY != 0
        frames: dict[int, Any] = {}
        frames_of(client, frames, 9)
        doomed = next(d for d in daemons if d.name == client.home["a"])
        doomed.kill()
        _reattached(client, doomed.name)
        state = client.export("a")
    assert state.chunk > 0, "it was not reattached from its checkpoint"
    assert state.host.get("priority") == 0, state.host


def _reattached(client: PoolClient, dead: str) -> None:
    limit = Deadline(what="a reattached on the survivor")
    while client.home.get("a") in (None, dead):
        limit.check(client.home)
        chunk = client.poll(timeout=0.5)
        if chunk is not None:
            chunk.release()


def test_load_model_reference_is_pipelined_as_the_twin_assumes() -> None:
    assert load_model("reference").manifest().pipelined == ReferenceModel().pipelined
