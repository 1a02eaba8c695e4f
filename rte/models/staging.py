"""Per-step inputs of a torch model: written by the host, copied to the device once.

A HOT step needs a few numbers per row (its arena row, where its noise and its
next cache slot are, its action) and a mask. Built as Python lists and sent
with ``torch.tensor(..., device=cuda)`` they cost a blocking copy each; here
the host writes them into page-locked buffers (NumPy views, no torch call) and
each goes to the device in one asynchronous copy, whatever the batch size. The
buffers are a ring of ``DEPTH``: one is written again only after the copy out
of it has completed (an event polled, never a device sync), which in steady
state it has.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

DEPTH = 4


class Staging:
    """Args:
    rows: the most rows a batch has.
    ints: int64 columns per row.
    mask: bool columns per row.
    device: where the inputs go.
    """

    def __init__(self, rows: int, ints: int, mask: int, device: torch.device) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        pinned = self._cuda
        self._ints = [torch.zeros((rows, ints), dtype=torch.int64, pin_memory=pinned)]
        self._masks = [torch.zeros((rows, mask), dtype=torch.bool, pin_memory=pinned)]
        for _ in range(DEPTH - 1 if self._cuda else 0):  # the CPU reads them at once: one
            self._ints.append(torch.zeros_like(self._ints[0], pin_memory=pinned))
            self._masks.append(torch.zeros_like(self._masks[0], pin_memory=pinned))
        self._copied: list[Any] = [None] * len(self._ints)
        self._next = 0
        self._rows = 0

    def host(self, rows: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The next buffers to write, as NumPy views of their first ``rows`` rows."""
        copied = self._copied[self._next]
        while copied is not None and not copied.query():  # the GPU is DEPTH steps behind
            time.sleep(20e-6)
        self._rows = rows
        return self._ints[self._next][:rows].numpy(), self._masks[self._next][:rows].numpy()

    def upload(
        self, into: tuple[torch.Tensor, ...] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What was written, on the device (on the current stream): new tensors, or
        copied into the first rows of ``into`` (a CUDA graph's static inputs)."""
        k, rows = self._next, self._rows
        self._next = (k + 1) % len(self._ints)
        ints, mask = self._ints[k][:rows], self._masks[k][:rows]
        if into is not None:
            ints = into[0][:rows].copy_(ints, non_blocking=True)
            mask = into[1][:rows].copy_(mask, non_blocking=True)
        elif not self._cuda:
            return ints, mask
        else:
            ints = ints.to(self.device, non_blocking=True)
            mask = mask.to(self.device, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call,unused-ignore]
        event.record()
        self._copied[k] = event
        return ints, mask


def to_device(array: np.ndarray[Any, Any], device: torch.device) -> torch.Tensor:
    """A host array on ``device``: on CUDA through page-locked memory, asynchronously
    (torch's caching host allocator keeps the block until the copy is done)."""
    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
