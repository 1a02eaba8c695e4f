"""A step's decoded frames, from the device into the slots the allocator gave.

The one write of a torch model's DEFERRED stage. On CUDA every copy is
asynchronous, on the DEFERRED stream, into page-locked memory (the pinned slab,
or :class:`rte.lanes.torch.PinnedHeap`); the engine publishes after its event.
How many copies a step costs follows the batch's output layout:

* ``batch.out_block``, one run of slots (one client's sessions, or a heap
  block): one copy. Slots hold the frame whole when the slab's slot alignment
  divides the frame's bytes; when they are wider, the run is copied whole,
  each frame padded to its slot on the device first, so the copy stays one
  contiguous page-locked transfer (a strided destination would go through a
  pageable temporary and block the host);
* ``batch.out_spans``, a run per client (a batch of several clients'
  sessions): one copy per client, the client's frames picked on the device;
* neither (scattered slots): a copy per frame.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rte.models.staging import to_device
from rte.stages import Batch


class SlabCopy:
    """Args:
    device: where the frames are.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._asynchronous = device.type == "cuda"
        self._padded: dict[tuple[int, int], torch.Tensor] = {}  # frames padded to slots
        self.copies = 0  # device-to-host copies issued (for tests and figures)

    def write(self, batch: Batch, frames: torch.Tensor) -> None:
        """Copy ``frames`` (one per row of ``batch``, on the device) into ``batch.out``."""
        if batch.out_block is not None:
            self._run(frames, batch.out_block)
            return
        if batch.out_spans:
            for positions, block in batch.out_spans:
                picked = self._pick(frames, positions)
                if block is not None:
                    self._run(picked, block)
                else:
                    self._each(picked, [batch.out[p] for p in positions])
            return
        self._each(frames, batch.out)

    def _each(self, frames: torch.Tensor, out: list[np.ndarray[Any, Any]]) -> None:
        for buffer, frame in zip(out, frames, strict=True):
            torch.from_numpy(buffer).copy_(frame, non_blocking=self._asynchronous)
            self.copies += 1

    def _pick(self, frames: torch.Tensor, positions: list[int]) -> torch.Tensor:
        first = positions[0]
        if positions == list(range(first, first + len(positions))):
            return frames[first : first + len(positions)]  # a view: nothing launched
        index = to_device(np.asarray(positions, np.int64), self.device)  # one async copy
        return frames.index_select(0, index)

    def _run(self, frames: torch.Tensor, block: np.ndarray[Any, Any]) -> None:
        n = len(frames)
        stride, nbytes = block.strides[0], block[0].nbytes
        self.copies += 1
        if stride == nbytes:
            torch.from_numpy(block).copy_(frames, non_blocking=self._asynchronous)
            return
        span = np.lib.stride_tricks.as_strided(
            block[0].reshape(-1).view(np.uint8), (n, stride), (stride, 1), writeable=True
        )
        slots = self._padded.get((n, stride))
        if slots is None:  # zeroed once, reused by every step on this (DEFERRED) stream
            slots = self._padded[n, stride] = torch.zeros(
                (n, stride), dtype=torch.uint8, device=self.device
            )
        slots[:, :nbytes].copy_(frames.reshape(n, -1).view(torch.uint8))
        torch.from_numpy(span).copy_(slots, non_blocking=self._asynchronous)
