"""ProbeModel: the reference model with a recorder, failure injection and an encode gate.

Every stage, seed and detach call is recorded with the lane it actually ran on
(as the engine's lanes report it from inside the call), its rows and chunks, so
tests can check lifecycle order. ``fail`` makes the next call of a named stage
raise; ``encode_gate`` holds encodes until the test opens it, which makes an
over-budget encode deterministic instead of timed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rte import Batch, ComposedEngine, Lane, Stage
from rte.models import ReferenceModel


class InjectedFailure(RuntimeError):
    pass


@dataclass(frozen=True)
class Call:
    name: str
    lane: Lane | None
    rows: tuple[int, ...]
    chunks: tuple[int, ...]
    sessions: tuple[str, ...]
    thread: str = ""


class ProbeModel(ReferenceModel):
    def __init__(self, max_sessions: int = 8, **kwargs: Any) -> None:
        self.need_pending = kwargs.pop("need_pending", 1)
        self.extra_heavy: frozenset[str] = kwargs.pop("extra_heavy", frozenset())
        super().__init__(max_sessions, **kwargs)
        self.engine: ComposedEngine | None = None
        self.calls: list[Call] = []
        self.fail: dict[str, BaseException] = {}
        self.encode_gate: threading.Event | None = None
        self.heavy_seen: list[tuple[str, str, Any]] = []

    def conditioning_keys(self) -> None:
        return None  # a probe takes any key (the tests add their own)

    def bind(self, engine: ComposedEngine) -> ComposedEngine:
        self.engine = engine
        return engine

    def _record(
        self, name: str, rows: Sequence[int], chunks: Sequence[int], sessions: Sequence[str]
    ) -> None:
        lane = self.engine.lanes.current if self.engine is not None else None
        thread = threading.current_thread().name
        self.calls.append(Call(name, lane, tuple(rows), tuple(chunks), tuple(sessions), thread))
        failure = self.fail.pop(name, None)
        if failure is not None:
            raise failure

    def _wrap(self, stage: Stage) -> Stage:
        inner: Callable[[Batch], object] = stage.fn

        def fn(batch: Batch) -> object:
            self._record(stage.name, batch.rows, batch.chunks, batch.sessions)
            if stage.lane is Lane.ENCODE:
                if self.encode_gate is not None:
                    assert self.encode_gate.wait(30), "encode gate never opened"
                for session, cond in zip(batch.sessions, batch.conditioning, strict=True):
                    for key in self.extra_heavy & cond.keys():
                        self.heavy_seen.append((session, key, cond[key]))
            return inner(batch)

        return Stage(stage.name, stage.lane, fn)

    def stages(self) -> Sequence[Stage]:
        return tuple(self._wrap(s) for s in super().stages())

    def heavy_keys(self) -> frozenset[str]:
        return super().heavy_keys() | self.extra_heavy

    def seed_ready(self, pending: Sequence[int]) -> bool:
        return len(pending) >= self.need_pending

    def seed(self, batch: Batch) -> None:
        self._record("seed", batch.rows, batch.chunks, batch.sessions)
        super().seed(batch)

    def detach(self, row: int) -> None:
        self._record("detach", (row,), (), ())
        super().detach(row)

    def names(self) -> list[str]:
        return [c.name for c in self.calls]


def make_engine(
    max_sessions: int = 8, *, midrun_attach: bool = True, **kwargs: Any
) -> tuple[ComposedEngine, ProbeModel]:
    model = ProbeModel(max_sessions, **kwargs)
    engine = model.bind(ComposedEngine(model, midrun_attach=midrun_attach))
    return engine, model


def chunks_of(results: Sequence[Any]) -> dict[str, tuple[int, np.ndarray[Any, Any]]]:
    """The chunks emitted in one step: session -> (chunk index, a copy of the latent)."""
    return {r.session: (r.chunk, r.latent.copy()) for r in results if r.has_chunk}
