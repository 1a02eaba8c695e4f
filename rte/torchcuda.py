"""torch's CUDA streams and events, as the backend of :class:`~rte.lanes.CudaLanes`.

Everything names its device: streams are made on it, every thread that
launches work makes it its current device first (CUDA's current device is per
thread), and the one wait the host does per step polls an event instead of
blocking in the driver, so the stepping thread can be preempted cheaply.
HOT gets the device's highest stream priority: its kernels go first when
DEFERRED's decode and ENCODE's prompts compete for the GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rte.lanes import Lane

POLL_SPINS = 200  # queries before the wait starts to sleep between them
POLL_NAP_S = 20e-6
HIGHEST_PRIORITY = -(1 << 10)  # below any device's range: its highest


class TorchCuda:
    """Args:
    device: ``"cuda"`` (the current device) or ``"cuda:N"``.
    """

    def __init__(self, device: str = "cuda") -> None:
        where = torch.device(device)
        if where.type != "cuda":
            raise ValueError(f"CUDA lanes need a CUDA device, got {device!r}")
        index = where.index if where.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.name = str(self.device)

    def bind_thread(self) -> None:
        torch.cuda.set_device(self.device)

    def stream(self, lane: Lane) -> Any:
        # lower is sooner; torch maps a value past the device's range to its end
        priority = HIGHEST_PRIORITY if lane is Lane.HOT else 0
        return torch.cuda.Stream(self.device, priority=priority)  # type: ignore[no-untyped-call,unused-ignore]

    def settle(self) -> None:
        torch.cuda.synchronize(self.device)

    def launch(self, stream: Any, fn: Callable[[Any], object], arg: Any) -> None:
        with torch.cuda.stream(stream):  # also makes the stream's device current
            fn(arg)

    def record(self, stream: Any) -> Any:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(stream)
        return event

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def host_wait(self, event: Any) -> None:
        spins = 0
        while not event.query():
            spins += 1
            if spins > POLL_SPINS:
                time.sleep(POLL_NAP_S)

    def synchronize(self, stream: Any) -> None:
        stream.synchronize()

    def hand_over(self, value: object, stream: Any) -> None:
        # A tensor allocated on one stream and read on another must not be
        # recycled by the caching allocator until the reader is done with it.
        if isinstance(value, torch.Tensor) and value.is_cuda:
            value.record_stream(stream)
        elif isinstance(value, dict):
            for item in value.values():
                self.hand_over(item, stream)
        elif isinstance(value, list | tuple):
            for item in value:
                self.hand_over(item, stream)

    def output_allocator(self, manifest: Any) -> PinnedHeap:
        return PinnedHeap(manifest)


class PinnedHeap:
    """An in-process engine's chunks on CUDA: each batch's block page-locked (from
    torch's caching host allocator, which keeps a block until the copies into it
    are done), so the decode's device-to-host copy is asynchronous, as it is into
    the daemon's pinned slab."""

    def __init__(self, manifest: Any) -> None:
        self._shape = tuple(manifest.latent_shape)
        self._dtype = torch.from_numpy(np.empty(0, manifest.latent_dtype)).dtype

    def allocate(self, batch: Any) -> list[np.ndarray[Any, Any]]:
        block = torch.empty((len(batch.rows), *self._shape), dtype=self._dtype, pin_memory=True)
        batch.out_block = block.numpy()
        return list(batch.out_block)

    def discard(self, batch: Any, buffers: list[np.ndarray[Any, Any]]) -> None:
        return None
