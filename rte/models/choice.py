"""``--model world`` on any device: the NumPy model on the CPU, the torch one on CUDA.

The short name ``world`` resolves here. Without a device (or with ``cpu``)
it is :class:`rte.models.learned.LearnedWorldModel`, NumPy, and torch is never
imported (the CPU path); with ``cuda``/``cuda:N`` it is
:class:`rte.models.learned_torch.TorchLearnedWorld`, the same network and
weights in torch, through the lanes, graphs and slab path of the ``torch``
model. ``world-torch`` asks for the torch one on any device.
"""

from __future__ import annotations

from typing import Any

from rte.models.learned import LearnedWorldModel
from rte.stages import StageModel


def learned_world(
    max_sessions: int = 8, *, device: str | None = None, **settings: Any
) -> StageModel:
    """The learned world for ``device`` (see the module's docstring)."""
    if device is None or device == "cpu":
        return LearnedWorldModel(max_sessions, **settings)
    return learned_world_torch(max_sessions, device=device, **settings)


def learned_world_torch(
    max_sessions: int = 8, *, device: str | None = None, **settings: Any
) -> StageModel:
    """The learned world in torch, on ``device`` (CUDA when available)."""
    from rte.models.learned_torch import TorchLearnedWorld  # noqa: PLC0415 (imports torch)

    return TorchLearnedWorld(max_sessions, device=device, **settings)
