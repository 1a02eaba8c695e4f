"""The reference model, with a gate in its state export: the engine holds there,
inside an export it has taken up (its input slot already checked), until the test
opens the gate. So a client can time out while its export is being carried out,
which a daemon otherwise does in microseconds.

``rte serve --model gated_export_model:gated_reference`` (with tests/ on
PYTHONPATH) takes the gate's path from ``RTE_TEST_EXPORT_GATE``; in process,
``GatedExport(gate=PATH)``. The gate is armed by creating ``PATH.armed``: the
next export consumes it, writes ``PATH.inside`` and waits (at most a minute)
for ``PATH.open``. The frames are the reference model's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rte.models import ReferenceModel
from rte.state import RowState

GATE_LIMIT_S = 60.0  # a gate never opened lets the export go on after this


class GatedExport(ReferenceModel):
    def __init__(self, gate: str | None = None, **settings: Any) -> None:
        super().__init__(**settings)
        self.gate = Path(gate or os.environ["RTE_TEST_EXPORT_GATE"])

    def export_rows(self, rows: Sequence[int]) -> list[RowState]:
        armed = self.gate.with_suffix(".armed")
        if armed.exists():
            armed.unlink()
            self.gate.with_suffix(".inside").write_text("inside the export")
            deadline = time.monotonic() + GATE_LIMIT_S
            while not self.gate.with_suffix(".open").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        return super().export_rows(rows)


def gated_reference(**settings: Any) -> GatedExport:
    return GatedExport(**settings)


class Gate:
    """The test's side of a :class:`GatedExport`'s gate at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def arm(self) -> None:
        self.path.with_suffix(".armed").write_text("armed")

    def inside(self) -> bool:
        return self.path.with_suffix(".inside").exists()

    def open(self) -> None:
        self.path.with_suffix(".open").write_text("open")
