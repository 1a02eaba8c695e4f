"""Models shipped with rte, and how to name one on a command line.

A model is named by a short name (``reference``) or as ``module:factory``,
where ``factory(**settings)`` returns a :class:`rte.StageModel`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from rte.models.null import NullModel
from rte.models.reference import ReferenceModel
from rte.stages import StageModel

SHORT_NAMES: dict[str, str] = {
    "reference": "rte.models.reference:ReferenceModel",
    "null": "rte.models.null:NullModel",
    "torch": "rte.models.world:TorchWorldModel",  # needs the torch extra
    # trained weights: NumPy on the CPU (torch never imported), torch on --device cuda
    "world": "rte.models.choice:learned_world",
    "world-torch": "rte.models.choice:learned_world_torch",  # the same, torch on any device
}

# What each short name is, in a few words: what a command that offers them shows.
DESCRIPTIONS: dict[str, str] = {
    "world": "trained weights in NumPy, a small world you walk in (in torch on --device cuda)",
    "world-torch": "the trained world in torch, on any device (the torch extra)",
    "reference": "deterministic NumPy stages on every lane, untrained: the tests' model",
    "null": "zero-cost stages, for the engine's own overhead",
    "torch": "random weights, untrained: a transformer exercising the lanes, the KV cache "
    "and CUDA on real tensors, its frames noise (the torch extra)",
}


def model_choices() -> str:
    """Every short name and what it is, for a command's help: ``world: ...; ...``."""
    return "; ".join(f"{name}: {text}" for name, text in DESCRIPTIONS.items())


def load_model(spec: str, **settings: Any) -> StageModel:
    """Build the model named ``spec`` with ``settings`` (e.g. ``max_sessions=8``)."""
    target = SHORT_NAMES.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(sorted(SHORT_NAMES))
        raise ValueError(f"model {spec!r} is neither a short name ({known}) nor module:factory")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            raise ImportError(
                f"model {spec!r} needs torch; install the extra: pip install -e '.[torch]'"
            ) from None
        raise
    factory: Callable[..., StageModel] = getattr(module, attr)
    model = factory(**settings)
    if not isinstance(model, StageModel):
        raise TypeError(f"{target} returned {type(model).__name__}, not a StageModel")
    return model


__all__ = [
    "DESCRIPTIONS",
    "SHORT_NAMES",
    "NullModel",
    "ReferenceModel",
    "load_model",
    "model_choices",
]
