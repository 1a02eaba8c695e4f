"""A model whose device breaks at a chosen chunk (a sticky CUDA error, simulated).

``RTE_LANES=sim rte serve --model faulty_model:faulty`` (with tests/ on
PYTHONPATH): HOT raises :class:`~rte.lanes.sim.DeviceFault` when any row makes
chunk ``FAULT_AT``, which breaks the simulated device for good.
"""

from __future__ import annotations

from typing import Any

from rte.lanes.sim import DeviceFault
from rte.models import ReferenceModel
from rte.stages import Batch

FAULT_AT = 6


class Faulty(ReferenceModel):
    def _denoise(self, batch: Batch) -> None:
        if FAULT_AT in batch.chunks:
            raise DeviceFault("an illegal memory access was encountered")
        super()._denoise(batch)


def faulty(**settings: Any) -> Faulty:
    return Faulty(**settings)
