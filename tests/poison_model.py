"""A model that fails on one prompt: the reference model whose encode and seed
raise for any row whose prompt is ``POISON``.

The prompt is well formed (it passes ``check_conditioning``), so it reaches the
stages: what a model's own bug or an input it cannot handle looks like.
``rte serve --model poison_model:poisoned`` (with tests/ on PYTHONPATH).
"""

from __future__ import annotations

from typing import Any

from rte.models import ReferenceModel
from rte.stages import Batch

POISON = "poison"


class PoisonFailure(RuntimeError):
    pass


def _check(what: str, batch: Batch) -> None:
    for session, cond in zip(batch.sessions, batch.conditioning, strict=True):
        if cond.get("prompt") == POISON:
            raise PoisonFailure(f"{what} cannot take the prompt of {session!r}")


class PoisonModel(ReferenceModel):
    def seed(self, batch: Batch) -> None:
        _check("seed", batch)
        super().seed(batch)

    def _encode_prompt(self, batch: Batch) -> None:
        _check("encode", batch)
        super()._encode_prompt(batch)


def poisoned(**settings: Any) -> PoisonModel:
    return PoisonModel(**settings)
