"""The null model: zero-cost stages, for measuring the engine's own overhead.

Every stage is a no-op that touches only the batch, so a step's time is the
scheduler's: arming, partitioning, batching, lane dispatch and results.
"""

from __future__ import annotations

from collections.abc import Sequence

from rte.composed import Batch, Stage, StageModel
from rte.contract import Manifest
from rte.lanes import Lane


class NullModel(StageModel):
    name = "null"

    def __init__(self, max_sessions: int = 64, *, pipelined: bool = True) -> None:
        self.max_sessions = max_sessions
        self.pipelined = pipelined

    def manifest(self) -> Manifest:
        return Manifest(
            max_sessions=self.max_sessions,
            pipeline_depth_chunks=2 if self.pipelined else 1,
            input_latency_chunks=1,
            latent_dtype="uint8",
            latent_shape=(16,),
            model=self.name,
        )

    def stages(self) -> Sequence[Stage]:
        return (
            Stage("generate", Lane.HOT, self.generate),
            Stage("decode", Lane.DEFERRED, self.decode),
        )

    def seed(self, batch: Batch) -> None:
        return None

    def detach(self, row: int) -> None:
        return None

    @staticmethod
    def generate(batch: Batch) -> None:
        batch.carry["latent"] = batch.rows

    @staticmethod
    def decode(batch: Batch) -> None:
        return None
