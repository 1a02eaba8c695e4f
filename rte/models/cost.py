"""A model's cost multiplier, for tests and benchmarks of real time.

Capacity, admission and overload are about how long a step takes; to show them
on demand a model's stages can be made to cost ``factor`` times what they
would. :class:`CostDial` times a stage's own work and then keeps the core busy
for ``factor - 1`` times as long (busy, not asleep: a heavier network uses the
core, and a sleeping stage would hand it to the callers). ``factor`` is a
model setting (``cost``) and may be changed while the model runs through a
file holding one more factor (``cost_file``: the cost is ``cost`` times it),
looked at no more than every :data:`LOOK_EVERY_S`, so a benchmark can double a
running daemon's cost and restore it. At 1 (the default, with no file) it costs one comparison.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

LOOK_EVERY_S = 0.1
MAX_FACTOR = 1000.0


class CostDial:
    """``factor`` times a stage's cost; ``path``: a file whose factor multiplies it."""

    def __init__(self, factor: float = 1.0, path: str | None = None) -> None:
        self.factor = _checked(factor, "cost")
        self.scale = 1.0  # the file's factor, on top of ``factor``
        self.path = path
        self._next_look = 0.0
        self._seen: float | None = None  # the file's mtime when last read

    @contextmanager
    def stage(self) -> Iterator[None]:
        """Around a stage's work: after it, stay busy for ``factor - 1`` times as long."""
        began = time.perf_counter()
        yield
        factor = self._current()
        if factor > 1.0:
            until = time.perf_counter() + (time.perf_counter() - began) * (factor - 1.0)
            while time.perf_counter() < until:
                pass

    def _current(self) -> float:
        if self.path is None:
            return self.factor * self.scale
        now = time.monotonic()
        if now >= self._next_look:
            self._next_look = now + LOOK_EVERY_S
            try:
                mtime = os.stat(self.path).st_mtime
                if mtime != self._seen:
                    with open(self.path) as f:
                        self.scale = _checked(float(f.read().strip() or 1), self.path)
                    self._seen = mtime
            except (OSError, ValueError):  # gone or garbled: keep the last factor
                pass
        return self.factor * self.scale


def _checked(factor: float, where: str) -> float:
    if not 0 < factor <= MAX_FACTOR:
        raise ValueError(f"{where}: a cost factor must be more than 0 and at most {MAX_FACTOR:g}")
    return float(factor)
