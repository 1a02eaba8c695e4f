"""The arena's rows, and what a due list resolves to, as :mod:`rte.composed` keeps them.

The :class:`Arena` is ``max_sessions`` fixed rows: which session holds which,
the chunks each row has generated, the sessions let go by their own failure
(FAILED until detached), and two generation counters: ``gen``, bumped by
anything that changes which rows a due list means (attach, detach, arming,
encodes), and ``conditioning_gen``, bumped by every change of a row's
conditioning. A :class:`Row` is one session's place: its conditioning
(replaced on change, never mutated, because batches share it), whether it is
armed, and the heavy change it is encoding or has staged. A :class:`Plan` is
what a due list resolves to while the arena is unchanged: the due rows, those
in the HOT batch, their sessions and indices, cached until ``gen`` moves.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rte.errors import UnknownSessionError
from rte.lanes import Completion
from rte.stages import Batch

_MISSING = object()


@dataclass(eq=False)
class Row:
    index: int
    session: str
    conditioning: dict[str, Any]  # replaced on change, never mutated: batches share it
    armed: bool = False
    encoding: Completion | None = None  # the encode of ``encoding_values`` under way
    encoding_values: dict[str, Any] = field(default_factory=dict)
    staged: dict[str, Any] = field(default_factory=dict)  # heavy changes not yet encoding

    def apply(
        self,
        changes: Mapping[str, Any],
        heavy: frozenset[str],
        heavy_equal: Callable[[str, Any, Any], bool],
    ) -> bool:
        """Take an action's ``changes``: light keys (and any key before the row is
        armed) at once, heavy keys staged for an encode unless equal (``heavy_equal``)
        to what the row will hold once its queued work is done. Whether any was staged."""
        staged = False
        conditioning = dict(self.conditioning)  # copy on write: batches hold the old one
        for key, value in changes.items():
            if key not in heavy or not self.armed:
                conditioning[key] = value
                continue
            effective = conditioning.get(key, _MISSING)
            if self.encoding is not None and key in self.encoding_values:
                effective = self.encoding_values[key]
            if effective is not _MISSING and heavy_equal(key, effective, value):
                self.staged.pop(key, None)
            else:
                self.staged[key] = copy.deepcopy(value)
                staged = True
        self.conditioning = conditioning
        return staged


class Arena:
    """The rows of one engine, by index and by session, and the last due list's plan."""

    def __init__(self, max_sessions: int) -> None:
        self.rows: list[Row | None] = [None] * max_sessions
        self.age = np.zeros(max_sessions, np.int64)  # chunks generated, per row
        self.by_session: dict[str, Row] = {}
        self.failed: dict[str, str] = {}  # detached by their own failure, not yet told: why
        self.gen = 0  # a cached plan is stale once it moves
        self.conditioning_gen = 0
        self._plan: Plan | None = None  # the last due list's

    def first_free(self) -> int | None:
        """The lowest free row, if any."""
        return next((i for i, r in enumerate(self.rows) if r is None), None)

    def take(self, index: int, session: str, conditioning: dict[str, Any]) -> Row:
        """Give row ``index`` (free) to ``session``, from its first chunk."""
        row = Row(index, session, conditioning)
        self.rows[index] = row
        self.by_session[session] = row
        self.age[index] = 0
        self.gen += 1
        return row

    def release(self, row: Row) -> None:
        """Free ``row``: its session is unknown from now on."""
        del self.by_session[row.session]
        self.rows[row.index] = None
        self.gen += 1

    def due_rows(self, due: tuple[str, ...]) -> list[Row]:
        """The rows of the due list ``due``: the cached plan's while it holds."""
        plan = self._plan
        if plan is not None and plan.gen == self.gen and plan.due == due:
            return plan.rows
        return self.resolve(due)

    def plan(self, due: tuple[str, ...], rows: list[Row], rejected: Mapping[str, str]) -> Plan:
        """The plan of ``due`` (its ``rows``), cached while the arena is unchanged; a
        one-off when some sessions' actions were ``rejected`` (they sit this step out)."""
        if rejected:
            return Plan(due, -1, rows, [r for r in rows if r.session not in rejected])
        plan = self._plan
        if plan is None or plan.gen != self.gen or plan.due != due:
            plan = self._plan = Plan(due, self.gen, rows, rows)
        return plan

    def batch(self, rows: list[Row], conditioning: list[dict[str, Any]]) -> Batch:
        """A batch of ``rows`` with ``conditioning``, at their next chunk (seed, ENCODE)."""
        chunks = [int(self.age[r.index]) for r in rows]
        return Batch([r.index for r in rows], [r.session for r in rows], chunks, conditioning)

    def live(self) -> list[Row]:
        """The rows held, in row order."""
        return [r for r in self.rows if r is not None]

    def lookup(self, session: str) -> Row:
        """The row of ``session``; UnknownSessionError (saying why, if it failed) if none."""
        row = self.by_session.get(session)
        if row is None:
            why = f" ({self.failed[session]})" if session in self.failed else ""
            raise UnknownSessionError(f"session {session!r} is not attached to this engine{why}")
        return row

    def resolve(self, sessions: Iterable[str]) -> list[Row]:
        """The rows of ``sessions``, once each, in order; the failed ones left out."""
        unique: Iterable[str] = dict.fromkeys(sessions)
        if self.failed:  # detached when they failed: nothing to step or finalize
            unique = [s for s in unique if s not in self.failed]
        return [self.lookup(s) for s in unique]


class Plan:
    """What a due list resolves to while the arena is unchanged (``gen``)."""

    def __init__(self, due: tuple[str, ...], gen: int, rows: list[Row], active: list[Row]):
        self.due = due
        self.gen = gen
        self.rows = rows  # the due rows, once each, in due order
        self.active = active  # those not refused an action this step
        self.index = [r.index for r in rows]
        self.hot = [r for r in active if r.armed and r.encoding is None]
        # ``hot_index is index`` says that every due row is in the HOT batch, in due order
        self.hot_index = self.index if len(self.hot) == len(rows) else [r.index for r in self.hot]
        self.hot_sessions = [r.session for r in self.hot]
        self.hot_at = np.array(self.hot_index, np.intp)
        self.conditioning: list[dict[str, Any]] = []
        self.conditioning_gen = -1
