"""A model on ``cuda:0`` in a process where torch cannot pin memory.

``rte serve --model pin_refused_model:pin_refused`` (with tests/ on PYTHONPATH,
torch installed): the daemon's lanes are torch's CUDA streams on ``cuda:0``, so
it page-locks its slab, and the pin really fails. On a CPU box torch is the CPU
build: the model answers yes to ``torch.cuda.is_available()`` (what a GPU box
answers; the one answer stood in for), and torch's own ``cudart()`` then
refuses for real ("Torch not compiled with CUDA enabled"). Nothing is ever
launched: the daemon is only started, joined and stopped.
"""

from __future__ import annotations

from typing import Any

import torch

from rte.models import ReferenceModel


class OnCuda(ReferenceModel):
    device = "cuda:0"


def pin_refused(**settings: Any) -> OnCuda:
    if not torch.cuda.is_available():
        torch.cuda.is_available = lambda: True
    return OnCuda(**settings)
