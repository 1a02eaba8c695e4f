"""The null model: zero-cost stages, for measuring the engine's own overhead.

Every stage only moves a number through the batch, so a step's time is the
scheduler's: arming, partitioning, batching, lane dispatch and results. The
number is the session's ``tag`` conditioning (an int, default -1), written as
an int64 into the first 8 bytes of each chunk: a benchmark sends a new tag and
times how long until a chunk carries it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rte.contract import Manifest
from rte.lanes import Lane
from rte.stages import Batch, Stage, StageModel
from rte.state import ModelIdentity, RowState, digest_of


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

    def state_identity(self) -> ModelIdentity:
        return ModelIdentity(self.name, digest_of(self.name))  # its rows hold nothing

    def export_rows(self, rows: Sequence[int]) -> list[RowState]:
        return [RowState() for _ in rows]

    def import_rows(self, rows: Sequence[int], states: Sequence[RowState]) -> None:
        return None

    def conditioning_keys(self) -> frozenset[str]:
        return frozenset({"tag"})

    def check_conditioning(self, conditioning: Mapping[str, Any]) -> None:
        tag = conditioning.get("tag", -1)
        if not isinstance(tag, int | np.integer) or not -(1 << 63) <= int(tag) < (1 << 63):
            raise ValueError(f"tag must be a 64-bit int, got {tag!r}")

    @staticmethod
    def generate(batch: Batch) -> None:
        batch.carry["tags"] = [c.get("tag", -1) for c in batch.conditioning]

    @staticmethod
    def decode(batch: Batch) -> None:
        for out, tag in zip(batch.out, batch.carry["tags"], strict=True):
            out[:8].view(np.int64)[0] = tag


def tag_of(latent: np.ndarray[Any, Any]) -> int:
    """The tag a null-model chunk carries."""
    return int(latent[:8].view(np.int64)[0])
