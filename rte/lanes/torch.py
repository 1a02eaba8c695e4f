"""torch's CUDA streams and events, as the backend of :class:`~rte.lanes.cuda.CudaLanes`.

Everything names its device: streams are made on it, every thread that
launches work makes it its current device first (CUDA's current device is per
thread). The one wait the host does per step (:func:`wait_for`) spins on the
event for a few microseconds, then blocks in the driver on it (its events are
made with blocking sync, and torch releases the GIL there), so it neither naps
past the copy's end nor holds the GIL against the ENCODE thread.

Priorities follow the step's critical path: HOT highest, then DEFERRED (which
``publish`` waits on every step), then ENCODE. Each lane's stream is its own,
made with ``cudaStreamCreateWithPriority`` in the runtime torch loaded: torch's
pool hands out 32 streams per priority and then wraps, so past a few engines in
one process lanes and graph sets would share streams (and cuBLAS workspaces).
Without that runtime the pool's streams are used, at the pool's priorities.

``stretch`` (for ``tools/gpu_check``) queues ``torch.cuda._sleep`` before each
stage of a lane: a missing wait then shows as a wrong frame, every time.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rte.lanes.base import Lane

SPIN_S = 20e-6  # a host wait queries this long, then blocks on the event
POOL_PRIORITY = {Lane.HOT: -(1 << 10), Lane.DEFERRED: -1, Lane.ENCODE: 0}  # torch clamps
_NON_BLOCKING = 0x01  # cudaStreamNonBlocking: no implicit order with the legacy stream
PINNED_BLOCKS = 8  # page-locked output blocks an in-process engine keeps and reuses


def wait_for(event: Any, spin_s: float = SPIN_S) -> None:
    """Return once ``event`` has completed: spin on ``query`` for ``spin_s`` (a copy
    about to end costs no wake-up), then block on it (``synchronize``: a blocking-
    sync event sleeps in the driver, with the GIL released)."""
    deadline = time.perf_counter() + spin_s
    while True:
        if event.query():
            return
        if time.perf_counter() >= deadline:
            break
    event.synchronize()


def lane_priorities(least: int, greatest: int) -> dict[Lane, int]:
    """CUDA stream priorities for the lanes, in a device's range (lower is sooner):
    HOT the greatest, ENCODE the least, DEFERRED between (or with HOT when the
    range has two levels only: it still goes before ENCODE)."""
    middle = greatest + 1 if least - greatest >= 2 else greatest
    return {Lane.HOT: greatest, Lane.DEFERRED: middle, Lane.ENCODE: least}


@functools.cache
def _runtime() -> Any:
    """The CUDA runtime torch loaded (ctypes), or None (then torch's stream pool)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        with contextlib.suppress(OSError, AttributeError):
            runtime = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            for name in ("cudaStreamCreateWithPriority", "cudaStreamDestroy"):
                getattr(runtime, name).restype = ctypes.c_int
            runtime.cudaDeviceGetStreamPriorityRange.restype = ctypes.c_int
            return runtime
    return None


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
        self.stretch: dict[Lane, int] = {}  # GPU cycles to sleep before each stage of a lane
        self.waited_s = 0.0  # time the host spent in host_wait (t_host: a step's wall less it)
        self._lane_of: dict[int, Lane] = {}
        self._own: list[int] = []  # streams made here, destroyed at close
        self._lock = threading.Lock()

    def bind_thread(self) -> None:
        torch.cuda.set_device(self.device)

    def stream(self, lane: Lane) -> Any:
        made = self._own_stream(lane)
        if made is None:  # torch's pool, at its (clamped) priorities
            made = torch.cuda.Stream(self.device, priority=POOL_PRIORITY[lane])  # type: ignore[no-untyped-call,unused-ignore]
        self._lane_of[made.cuda_stream] = lane
        return made

    def _own_stream(self, lane: Lane) -> Any:
        runtime = _runtime()
        if runtime is None:
            return None
        least, greatest = ctypes.c_int(), ctypes.c_int()
        handle = ctypes.c_void_p()
        with torch.cuda.device(self.device):
            if runtime.cudaDeviceGetStreamPriorityRange(
                ctypes.byref(least), ctypes.byref(greatest)
            ):
                return None
            priority = lane_priorities(least.value, greatest.value)[lane]
            if runtime.cudaStreamCreateWithPriority(ctypes.byref(handle), _NON_BLOCKING, priority):
                return None
        with self._lock:
            self._own.append(int(handle.value or 0))
        return torch.cuda.ExternalStream(int(handle.value or 0), device=self.device)  # type: ignore[no-untyped-call,unused-ignore]

    def close(self) -> None:
        """Destroy the streams made here (after the lanes drained)."""
        runtime = _runtime()
        with self._lock:
            own, self._own = self._own, []
        for handle in own:
            runtime.cudaStreamDestroy(ctypes.c_void_p(handle))

    def settle(self) -> None:
        torch.cuda.synchronize(self.device)

    def launch(self, stream: Any, fn: Callable[[Any], object], arg: Any) -> None:
        with torch.cuda.stream(stream):  # also makes the stream's device current
            cycles = self.stretch.get(self._lane_of.get(stream.cuda_stream, Lane.HOT), 0)
            if cycles:
                torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call,unused-ignore]
            fn(arg)

    def record(self, stream: Any) -> Any:
        event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
        event.record(stream)
        return event

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def host_wait(self, event: Any) -> None:
        t0 = time.perf_counter()
        wait_for(event)
        self.waited_s += time.perf_counter() - t0  # the host's share of a step is the rest

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

    def handed_out(self, batches: list[Any]) -> None:
        """Nothing to check on a real device (the simulated one checks the order)."""

    def output_allocator(self, manifest: Any) -> PinnedHeap:
        return PinnedHeap(manifest)


class PinnedHeap:
    """An in-process engine's chunks on CUDA: page-locked blocks, so the decode's
    device-to-host copy is asynchronous, as it is into the daemon's pinned slab.

    A bounded pool of blocks of the arena's rows, each made once and reused once
    nothing refers to it any more (the results of the batch it held were dropped,
    after their copy was published): a ``cudaHostAlloc`` per step is an implicit
    device synchronization, and page-locked memory that grows with a consumer
    that keeps frames is a leak. When every block is still held (a consumer that
    keeps more than ``blocks`` steps of frames) a batch gets a block of torch's
    caching host allocator, as before, and the pool does not grow.

    Args:
        manifest: the model's (rows and frame layout).
        blocks: the most blocks kept for reuse.
        pinned: page-locked (False only for the CPU tests of the pool itself).
    """

    def __init__(self, manifest: Any, blocks: int = PINNED_BLOCKS, *, pinned: bool = True) -> None:
        self._shape = (int(manifest.max_sessions), *tuple(manifest.latent_shape))
        self._dtype = torch.from_numpy(np.empty(0, manifest.latent_dtype)).dtype
        self._pinned = pinned
        self._most = blocks
        self._blocks: list[np.ndarray[Any, Any]] = []
        self.made = 0  # blocks ever made (for tests and figures)

    def _new(self, rows: int) -> np.ndarray[Any, Any]:
        self.made += 1
        shape = (rows, *self._shape[1:])
        return torch.empty(shape, dtype=self._dtype, pin_memory=self._pinned).numpy()

    def allocate(self, batch: Any) -> list[np.ndarray[Any, Any]]:
        n = len(batch.rows)
        block: np.ndarray[Any, Any] | None = None
        for kept in self._blocks:
            # the pool's reference, the loop's and getrefcount's own: no view is left
            if sys.getrefcount(kept) <= 3 and len(kept) >= n:
                block = kept
                break
        if block is None:
            block = self._new(max(n, self._shape[0]))
            if len(self._blocks) < self._most:
                self._blocks.append(block)
        batch.out_block = block[:n]
        return list(batch.out_block)

    def discard(self, batch: Any, buffers: list[np.ndarray[Any, Any]]) -> None:
        return None
