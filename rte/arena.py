"""The arena's rows and what a due list resolves to, as :mod:`rte.composed` keeps them.

A :class:`Row` is one session's place in the arena: its conditioning (replaced
on change, never mutated, because batches share it), whether it is armed, and
the heavy change it is encoding or has staged. A :class:`Plan` is what a due
list resolves to while the arena is unchanged: the due rows, those in the HOT
batch, their sessions and indices, cached until anything changes the arena.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rte.lanes import Completion


@dataclass(eq=False)
class Row:
    index: int
    session: str
    conditioning: dict[str, Any]  # replaced on change, never mutated: batches share it
    armed: bool = False
    encoding: Completion | None = None  # the encode of ``encoding_values`` under way
    encoding_values: dict[str, Any] = field(default_factory=dict)
    staged: dict[str, Any] = field(default_factory=dict)  # heavy changes not yet encoding


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
