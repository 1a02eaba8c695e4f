"""CUDA graphs of one computation, one per padded batch size, captured on first use.

A step of a small model is dozens of short kernels; launched one by one from
Python, the launches cost more than the work. Captured once as a CUDA graph,
a step is one launch. A graph replays fixed shapes at fixed addresses, so a
:class:`GraphSet` keeps, per padded batch size (1, 2, 4, … up to the arena),
the static input tensors the caller fills (rows past the batch padded with
harmless values) and the output the replay writes. Graphs of one set replay
in order on one stream and share one memory pool and one capture stream; two
sets that run concurrently (HOT and DEFERRED) each have their own (graphs
captured on one stream share cuBLAS's workspace for it).

If a capture fails (an op that cannot be captured, an old driver), the set
says why in :attr:`failed` and the caller runs eagerly from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("rte.models")

WARMUP = 3  # eager runs on a side stream before a capture, as torch asks


def padded(n: int, most: int) -> int:
    """The graph size that takes ``n`` rows: the next power of two, at most ``most``."""
    size = 1
    while size < n:
        size *= 2
    return min(size, most)


class GraphSet:
    """Args:
    fn: the computation, from static inputs to one output tensor.
    statics: makes the static inputs for a size, filled with harmless values
        (the warm-up runs write what ``fn`` writes, for those rows).
    """

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        statics: Callable[[int], tuple[torch.Tensor, ...]],
        most: int,
    ) -> None:
        self._fn = fn
        self._statics = statics
        self.sizes = sorted({padded(n, most) for n in range(1, most + 1)})
        self._graphs: dict[int, tuple[Any, tuple[torch.Tensor, ...], torch.Tensor]] = {}
        self._pool: Any = None
        self._stream: Any = None  # this set's own: captures must not share torch's one
        self.failed: str | None = None

    def inputs(self, size: int) -> tuple[torch.Tensor, ...] | None:
        """The static inputs of the graph of ``size``; None when graphs failed: run
        eagerly. The first call captures every size, so that a batch of a new size
        (a join, a leave) never stalls a step with a capture's device sync."""
        if self.failed is not None:
            return None
        if not self._graphs:
            try:
                for each in self.sizes:
                    self._graphs[each] = self._capture(each)
            except Exception as exc:  # any capture failure: run eagerly
                self.failed = f"{type(exc).__name__}: {exc}"
                log.warning("CUDA graph capture failed, running eagerly: %s", self.failed)
                return None
        return self._graphs[size][1]

    def replay(self, size: int) -> torch.Tensor:
        """Replay the graph of ``size`` on the current stream; its output tensor."""
        graph, _, output = self._graphs[size]
        graph.replay()
        return output

    def _capture(self, size: int) -> tuple[Any, tuple[torch.Tensor, ...], torch.Tensor]:
        inputs = self._statics(size)
        if self._stream is None:
            self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call,unused-ignore]
            self._pool = torch.cuda.graph_pool_handle()
        side = self._stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                self._fn(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(
            graph, pool=self._pool, stream=side, capture_error_mode="thread_local"
        ):
            output = self._fn(*inputs)
        return graph, inputs, output
