"""Page-locking shared memory with CUDA, when torch with CUDA is already loaded.

A slab registered with ``cudaHostRegister`` takes device-to-host copies
straight into its slots, asynchronously, at full bandwidth (a pageable
destination is copied through a staging buffer instead). This module never
imports torch: without torch already imported by the caller, or without a
GPU, registering is a no-op that says so.

A refused ``cudaHostRegister`` / ``cudaHostUnregister`` also leaves CUDA's
per-thread *last error* set, and torch checks that after every kernel launch:
the next, unrelated launch on the thread would raise it. So a refusal resets
it (:func:`_forget_error`) before it is raised here, as a SegmentError.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from typing import Any

from shm.errors import SegmentError

HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every device's context


def register(address: int, size: int, name: str, device: int | None = None) -> bool:
    """Page-lock ``size`` bytes at ``address`` (of segment ``name``); False
    without torch with CUDA. ``device``: the GPU whose context does it (the
    pages are portable: every device's copies see them as page-locked), so a
    daemon on GPU N creates no context on GPU 0.

    Raises:
        SegmentError: cudaHostRegister refused.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return False
    cudart = torch.cuda.cudart()
    with _on(torch, device):
        rc = cudart.cudaHostRegister(address, size, HOST_REGISTER_PORTABLE)
    if int(rc) != 0:
        _forget_error(torch, device)
        raise SegmentError(
            f"cudaHostRegister of the {size:,} slot bytes of {name} failed with "
            f"{_error(cudart, rc)}; the slab works unpinned (slower copies from the GPU)"
        )
    return True


def unregister(address: int, name: str, device: int | None = None) -> None:
    """Undo :func:`register` (before the segment is unmapped).

    Raises:
        SegmentError: cudaHostUnregister refused. The pages may stay locked
            until the process exits (CUDA's last error is reset: no later launch
            reports this refusal again).
    """
    torch = sys.modules["torch"]
    cudart = torch.cuda.cudart()
    with _on(torch, device):
        rc = cudart.cudaHostUnregister(address)
    if int(rc) != 0:
        _forget_error(torch, device)
        raise SegmentError(
            f"cudaHostUnregister of the slots of {name} failed with {_error(cudart, rc)}; "
            "the pages may stay page-locked until this process exits (unpin from the "
            "process and CUDA context that pinned them, before closing the segment)"
        )


def _forget_error(torch: Any, device: int | None) -> None:
    """Reset this thread's CUDA last error, which a refused runtime call leaves set.

    torch's own cudart binding has no ``cudaGetLastError``, so it is called in the
    CUDA runtime this process loaded (the same library instance torch calls, found
    by its path among this process's mappings). Without one (a runtime linked
    into torch), a trivial launch does it: torch's check after it reads the error,
    which resets it, and raises it, here, where it is expected.
    """
    runtime = _loaded_runtime()
    if runtime is not None:
        runtime.cudaGetLastError()
        return
    where = "cuda" if device is None else f"cuda:{device}"
    with contextlib.suppress(Exception):  # the refusal again, as expected (or no CUDA at all)
        torch.zeros(1, device=where)


@functools.cache
def _loaded_runtime() -> Any:
    """The CUDA runtime library this process has loaded (ctypes), None if none."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        with contextlib.suppress(OSError):  # (an already loaded library: no new instance)
            runtime = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            runtime.cudaGetLastError.restype = ctypes.c_int
            return runtime
    return None


def _on(torch: Any, device: int | None) -> Any:
    """``device``'s context current for a call (None: whichever is current)."""
    return contextlib.nullcontext() if device is None else torch.cuda.device(device)


def _error(cudart: Any, rc: Any) -> str:
    """A CUDA runtime status as its number and CUDA's own words for it."""
    try:
        words = str(cudart.cudaGetErrorString(rc))
    except Exception:  # an older torch without it: the number alone
        return f"CUDA error {int(rc)}"
    return f"CUDA error {int(rc)} ({words})"
