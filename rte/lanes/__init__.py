"""Execution lanes, a package: where a stage's work runs, and on what.

* :mod:`rte.lanes.base`: :class:`Lane` (HOT, DEFERRED, ENCODE) and the
  :class:`Lanes` interface the step body drives;
* :mod:`rte.lanes.cpu`: :class:`CpuLanes`, HOT and DEFERRED inline, ENCODE on a
  worker thread;
* :mod:`rte.lanes.cuda`: :class:`CudaLanes`, a stream per lane over a
  :class:`StreamBackend`;
* :mod:`rte.lanes.torch`: torch's streams and events (imports torch, so only
  :func:`make_lanes` for a CUDA device loads it);
* :mod:`rte.lanes.sim`: a simulated CUDA device with a race detector, on which
  the tests run the CUDA path without a GPU.

Lanes are chosen once, when the engine is built, from the model's device
(``model.device``): CUDA streams for a model on ``cuda:N``, CPU lanes for one
on the CPU, whatever else the process has loaded.
"""

from __future__ import annotations

import os

from rte.lanes.base import Completion, Lane, Lanes, LanesFault
from rte.lanes.cpu import CpuLanes
from rte.lanes.cuda import CudaLanes, StreamBackend
from rte.lanes.sim import SimCuda


def make_lanes(kind: str = "auto", device: str = "cpu") -> Lanes:
    """Lanes of ``kind`` for a model on ``device``.

    ``"auto"`` follows the device: CUDA streams for ``cuda`` / ``cuda:N``, else
    CPU lanes, or simulated CUDA streams when ``RTE_LANES=sim`` is set (how
    the tests run the CUDA path on the CPU). ``"cpu"``, ``"cuda"`` and ``"sim"``
    choose directly.
    """
    if kind == "auto":
        if device.startswith("cuda"):
            kind = "cuda"
        else:
            kind = "sim" if os.environ.get("RTE_LANES") == "sim" else "cpu"
    if kind == "cpu":
        return CpuLanes()
    if kind == "cuda":
        from rte.lanes.torch import TorchCuda  # noqa: PLC0415 (imports torch)

        return CudaLanes(TorchCuda(device if device.startswith("cuda") else "cuda"))
    if kind == "sim":
        return CudaLanes(SimCuda())
    raise ValueError(f"unknown lanes kind {kind!r}; expected 'auto', 'cpu', 'cuda' or 'sim'")


__all__ = [
    "Completion",
    "CpuLanes",
    "CudaLanes",
    "Lane",
    "Lanes",
    "LanesFault",
    "SimCuda",
    "StreamBackend",
    "make_lanes",
]
