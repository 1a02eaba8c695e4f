"""ReplicaEngine: one engine made of child engines, sessions routed over them.

For models that cannot batch (B=1) or that want several small cohorts. A
session is placed by :mod:`rte.placement` with ``pack=True``: on a child with
room, the fullest first (the children step one after another in one thread, so
joining a busy child's batch is cheaper than waking an idle one), then an idle
pooled child, then a new one from the factory, up to ``max_children``. It stays
there (sticky). A child left without sessions returns to the pool for reuse.

:meth:`ReplicaEngine.of_model` makes the children ComposedEngines of a
StageModel factory, all writing through one output allocator: that is how a
daemon serves several engines (``rte serve --engines N``), its chunks going
into its slab whichever child made them.

A session's state (:mod:`rte.state`) is the owning child's: ``suspend`` asks
it and releases the session's place; ``resume`` places the session as attach
does, on a child whose model is the state's (``state_identity``), which checks it.

Failure isolation: a child's ``step``/``finalize`` failure is caught and turned
into ERROR results for that child's sessions only, so one bad session cannot
starve the others. A child whose ``detach`` failed keeps ownership of the
session and is never pooled again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rte.composed import ComposedEngine
from rte.contract import Action, Engine, Manifest, ResultKind, StepResult, Timing
from rte.errors import AdmissionError, RequestError, StateError, UnknownSessionError
from rte.output import OutputAllocator
from rte.placement import Placement
from rte.stages import StageModel
from rte.state import SessionState


@dataclass(eq=False)
class _Child:
    engine: Engine
    sessions: set[str] = field(default_factory=set)
    broken: bool = False  # its detach failed: it keeps its sessions, never pooled


class ReplicaEngine:
    """A Level-1 engine routing sessions over children made by ``factory``."""

    def __init__(self, factory: Callable[[], Engine], max_children: int) -> None:
        if max_children < 1:
            raise ValueError(f"max_children must be >= 1, got {max_children}")
        self._factory = factory
        self._max_children = max_children
        first = _Child(factory())
        self._children: list[_Child] = [first]
        self._pool: list[_Child] = [first]
        self._route: Placement[_Child] = Placement(pack=True)
        child = first.engine.manifest()
        self._child_capacity = child.max_sessions
        self._manifest = Manifest(
            max_sessions=child.max_sessions * max_children,
            pipeline_depth_chunks=child.pipeline_depth_chunks,
            input_latency_chunks=child.input_latency_chunks,
            latent_dtype=child.latent_dtype,
            latent_shape=child.latent_shape,
            model=child.model,
        )

    @classmethod
    def of_model(
        cls,
        make_model: Callable[[], StageModel],
        max_children: int,
        *,
        allocator: OutputAllocator | None = None,
        lanes: str = "auto",
    ) -> ReplicaEngine:
        """Children ``ComposedEngine(make_model(), allocator=allocator)``: each a
        cohort of its own, every chunk written where ``allocator`` says."""

        def child() -> Engine:
            return ComposedEngine(make_model(), allocator=allocator, lanes=lanes)

        return cls(child, max_children)

    def manifest(self) -> Manifest:
        return self._manifest

    @property
    def lanes(self) -> Any:
        """The first child's lanes (where they compute: every child alike)."""
        return getattr(self._children[0].engine, "lanes", None)

    def close(self) -> None:
        """Close every child that can be."""
        for child in self._children:
            close = getattr(child.engine, "close", None)
            if close is not None:
                close()

    def attach(self, session: str, conditioning: Mapping[str, Any] | None = None) -> None:
        if session in self._route:
            return
        self._place(session, lambda engine: engine.attach(session, conditioning))

    def _place(self, session: str, enter: Callable[[Any], None]) -> None:
        """Give ``session`` to the first child that ``enter`` admits it to (the
        fullest with room first, then a pooled one, then a new one)."""
        busy = [c for c in self._children if c.sessions and c not in self._pool]
        rooms = {c: self._child_capacity - len(c.sessions) for c in [*busy, *self._pool]}
        for child in self._route.choices(session, rooms, live=lambda c: not c.broken):
            try:
                enter(child.engine)
            except AdmissionError:
                continue
            self._take(child, session)
            return
        if len(self._children) < self._max_children:
            child = _Child(self._factory())
            self._children.append(child)
            self._pool.append(child)  # (it stays pooled if ``enter`` refuses)
            enter(child.engine)
            self._take(child, session)
            return
        raise AdmissionError(
            f"session {session!r} refused: all {self._max_children} child engines are full; "
            "detach a session or retry later"
        )

    def step(
        self, due: Iterable[str], actions: Mapping[str, Action] | None = None
    ) -> list[StepResult]:
        due = list(dict.fromkeys(due))
        by_child = self._group(due)
        actions = actions or {}
        results: dict[str, StepResult] = {}
        for child, sessions in by_child:
            child_actions = {s: actions[s] for s in sessions if s in actions}
            results.update(self._guarded(sessions, child.engine.step, sessions, child_actions))
        return [results[s] for s in due]

    def finalize(self, sessions: Iterable[str] | None = None) -> list[StepResult]:
        names = list(self._route) if sessions is None else list(dict.fromkeys(sessions))
        results: list[StepResult] = []
        for child, group in self._group(names):
            done = self._guarded(group, child.engine.finalize, group)
            results.extend(done.values())
        return results

    def detach(self, session: str) -> None:
        child = self._owner(session)
        try:
            child.engine.detach(session)
        except BaseException:
            child.broken = True
            raise
        self._leave(child, session)

    def _leave(self, child: _Child, session: str) -> None:
        child.sessions.discard(session)
        self._route.release(session)
        if not child.sessions and not child.broken:
            self._pool.append(child)

    # -- a session's state out and back in -----------------------------------

    @property
    def can_suspend(self) -> bool:
        """Whether the children's model exports its rows' state (they are all alike)."""
        return bool(getattr(self._children[0].engine, "can_suspend", False))

    def suspend(self, session: str) -> SessionState:
        """The owning child's :meth:`ComposedEngine.suspend`; the session's place is
        released (its child pooled when it is left empty)."""
        child = self._owner(session)
        suspend = getattr(child.engine, "suspend", None)
        if suspend is None:
            raise StateError(
                f"session {session!r} cannot be suspended: {type(child.engine).__name__} "
                "does not export its sessions' state; detach it instead"
            )
        state: SessionState = suspend(session)
        self._leave(child, session)
        return state

    def resume(self, session: str, state: SessionState) -> None:
        """Place ``session`` as attach does and resume it there from ``state``
        (StateError from the child for a foreign state: no child took it)."""
        if session in self._route:
            raise RequestError(
                f"session {session!r} cannot resume: it is attached to this engine; "
                "suspend or detach it first"
            )
        self._place(session, lambda engine: engine.resume(session, state))

    def check_action(self, session: str, action: Action) -> None:
        """The owning child's check, when it has one (see ComposedEngine.check_action)."""
        check = getattr(self._owner(session).engine, "check_action", None)
        if check is not None:
            check(session, action)

    # -- introspection ----------------------------------------------------

    def children(self) -> list[Engine]:
        """Every child engine made so far, in creation order."""
        return [c.engine for c in self._children]

    def child_of(self, session: str) -> Engine:
        return self._owner(session).engine

    def pooled(self) -> list[Engine]:
        """Idle children ready for reuse."""
        return [c.engine for c in self._pool]

    # -- helpers ----------------------------------------------------------

    def _take(self, child: _Child, session: str) -> None:
        if child in self._pool:
            self._pool.remove(child)
        child.sessions.add(session)
        self._route.settle(session, child)

    def _owner(self, session: str) -> _Child:
        child = self._route.get(session)
        if child is None:
            raise UnknownSessionError(f"session {session!r} is not attached to this engine")
        return child

    def _group(self, sessions: list[str]) -> list[tuple[_Child, list[str]]]:
        groups: dict[int, tuple[_Child, list[str]]] = {}
        for s in sessions:
            child = self._owner(s)
            groups.setdefault(id(child), (child, []))[1].append(s)
        return list(groups.values())

    @staticmethod
    def _guarded(
        sessions: list[str], call: Callable[..., Sequence[StepResult]], *args: Any
    ) -> dict[str, StepResult]:
        """Run one child's call; its failure becomes ERROR results for its sessions only."""
        started = time.monotonic_ns()
        try:
            return {r.session: r for r in call(*args)}
        except Exception as exc:
            now = time.monotonic_ns()
            message = f"{type(exc).__name__}: {exc}"
            return {
                s: StepResult(s, -1, ResultKind.ERROR, None, Timing(started, now), message)
                for s in sessions
            }
