"""The compiled C module (atomics, ring, slab), with a clear error when it is missing."""

from __future__ import annotations

from typing import Any

try:
    from shm._native import ffi as _ffi
    from shm._native import lib as _lib
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "shm's compiled module is missing: install the package with a C compiler present "
        "(pip install -e . builds it; on Debian: apt-get install gcc python3-dev)"
    ) from exc

ffi: Any = _ffi
lib: Any = _lib
