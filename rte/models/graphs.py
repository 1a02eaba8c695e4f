"""CUDA graphs of one computation, one per padded batch size, captured at model load.

A step of a small model is dozens of short kernels; launched one by one from
Python, the launches cost more than the work. Captured once as a CUDA graph,
a step is one launch. A graph replays fixed shapes at fixed addresses, so a
:class:`GraphSet` keeps, per padded batch size (1, 2, 4, … up to the arena),
the static input tensors the caller fills (rows past the batch padded with
harmless values) and the output the replay writes. Graphs of one set replay
in order on one stream and share one memory pool and one capture stream; two
sets that run concurrently (HOT and DEFERRED) each have their own (graphs
captured on one stream share cuBLAS's workspace for it).

Every size is captured at once, when the model loads (:meth:`GraphSet.capture`),
not inside the first steps of a serve loop: each capture synchronizes the
device and flushes the allocator's cache. If a capture fails (an op that cannot
be captured, an old driver), the set says why in :attr:`failed`, the thread's
current stream is the one it was before (torch's ``graph.__exit__`` ends the
capture before it restores the stream, and ending a failed capture raises too:
the restore is in a ``finally`` here), and the caller runs eagerly from then on.
:attr:`replays` counts replays, so a check can tell graphs ran.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("rte.models")

WARMUP = 3  # eager runs on a side stream before a capture, as torch asks


def padded(n: int, most: int) -> int:
    """The graph size that takes ``n`` rows: the next power of two, at most ``most``
    (a model whose rows must compute alike at every batch size pads to ``most``)."""
    size = 1
    while size < n:
        size *= 2
    return min(size, most)


class GraphSet:
    """Args:
    fn: the computation, from static inputs to one output tensor.
    statics: makes the static inputs for a size, filled with harmless values
        (the warm-up runs write what ``fn`` writes, for those rows).
    sizes: the padded sizes to capture (the sizes ``padded`` gives up to ``most``).
    cuda: torch's CUDA module (a stand-in only in the CPU tests of the capture's
        failure path).
    """

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        statics: Callable[[int], tuple[torch.Tensor, ...]],
        sizes: list[int],
        cuda: Any = None,
    ) -> None:
        self._fn = fn
        self._statics = statics
        self.sizes = sorted(set(sizes))
        self._cuda = torch.cuda if cuda is None else cuda
        self._graphs: dict[int, tuple[Any, tuple[torch.Tensor, ...], torch.Tensor]] = {}
        self._pool: Any = None
        self._stream: Any = None  # this set's own: captures must not share torch's one
        self.failed: str | None = None
        self.replays = 0

    def capture(self) -> bool:
        """Capture every size now (at model load); False, with :attr:`failed` set and
        the current stream restored, when one fails: the caller runs eagerly."""
        if self.failed is None and not self._graphs:
            try:
                for each in self.sizes:
                    self._graphs[each] = self._capture(each)
            except Exception as exc:  # any capture failure: run eagerly
                self._graphs.clear()
                self.failed = f"{type(exc).__name__}: {exc}"
                log.warning("CUDA graph capture failed, running eagerly: %s", self.failed)
        return self.failed is None

    def inputs(self, size: int) -> tuple[torch.Tensor, ...] | None:
        """The static inputs of the graph of ``size``; None when graphs failed: run
        eagerly. (Captures every size first if :meth:`capture` was not called.)"""
        if not self.capture():
            return None
        return self._graphs[size][1]

    def replay(self, size: int) -> torch.Tensor:
        """Replay the graph of ``size`` on the current stream; its output tensor."""
        graph, _, output = self._graphs[size]
        graph.replay()
        self.replays += 1
        return output

    def _capture(self, size: int) -> tuple[Any, tuple[torch.Tensor, ...], torch.Tensor]:
        cuda = self._cuda
        inputs = self._statics(size)
        if self._stream is None:
            self._stream = cuda.Stream()
            self._pool = cuda.graph_pool_handle()
        side = self._stream
        before = cuda.current_stream()
        try:
            side.wait_stream(before)
            with cuda.stream(side):
                for _ in range(WARMUP):
                    self._fn(*inputs)
            before.wait_stream(side)
            graph = cuda.CUDAGraph()
            with cuda.graph(graph, pool=self._pool, stream=side, capture_error_mode="thread_local"):
                output = self._fn(*inputs)
        finally:  # a failed capture_end raises before graph.__exit__ restores the stream
            cuda.set_stream(before)
        return graph, inputs, output
