"""A model whose step costs a known time per row, for tests of real time.

The null model (each chunk carries its session's ``tag``) with a HOT stage
that sleeps ``row_ms`` per row times a factor: asleep, not busy, so its cost
holds on a loaded box and the capacity at a pace is predictable
(about ``budget / row_ms``). The factor is read from ``cost_file`` (one number),
looked at every 50 ms, so a test can raise the cost mid-run and drop it again.
``rte serve --model rowcost_model:rowcost`` (tests/ on PYTHONPATH) takes both
from ``RTE_TEST_ROW_MS`` and ``RTE_TEST_COST_FILE``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from rte.lanes import Lane
from rte.models.null import NullModel
from rte.stages import Batch, Stage

LOOK_EVERY_S = 0.05


class RowCostModel(NullModel):
    name = "rowcost"

    def __init__(
        self,
        max_sessions: int = 32,
        *,
        pipelined: bool = False,
        row_ms: float = 4.0,
        cost_file: str | None = None,
    ) -> None:
        super().__init__(max_sessions, pipelined=pipelined)
        self.row_s = row_ms / 1000
        self.cost_file = cost_file
        self.factor = 1.0
        self._next_look = 0.0

    def stages(self) -> Sequence[Stage]:
        return (Stage("work", Lane.HOT, self.work), *super().stages())

    def work(self, batch: Batch) -> None:
        time.sleep(self.row_s * self._factor() * len(batch.rows))

    def _factor(self) -> float:
        now = time.monotonic()
        if self.cost_file and now >= self._next_look:
            self._next_look = now + LOOK_EVERY_S
            try:
                with open(self.cost_file) as f:
                    self.factor = float(f.read().strip() or 1)
            except (OSError, ValueError):
                pass
        return self.factor


def rowcost(**settings: Any) -> RowCostModel:
    """The daemon's factory: ``row_ms`` and ``cost_file`` from the environment."""
    row_ms = float(os.environ.get("RTE_TEST_ROW_MS", "4"))
    return RowCostModel(row_ms=row_ms, cost_file=os.environ.get("RTE_TEST_COST_FILE"), **settings)
