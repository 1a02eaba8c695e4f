"""Kernel intervals per CUDA stream from a profiler trace, and how much two overlap.

``torch.profiler`` exports a Chrome trace whose GPU kernels are events of
category ``kernel`` with a ``stream`` argument. :func:`busy` merges each
stream's kernels into intervals; :func:`overlap` is the time two streams were
busy at once. ``tools.gpu_check`` reports HOT/DEFERRED overlap this way: a
pipelined engine whose DEFERRED decode never runs while HOT works has 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Intervals = list[tuple[float, float]]  # (start, end) in microseconds, sorted, disjoint


def kernels(trace: dict[str, Any]) -> dict[int, Intervals]:
    """Each stream's kernel intervals, merged, from a Chrome trace object."""
    spans: dict[int, Intervals] = {}
    for event in trace.get("traceEvents", []):
        if event.get("cat") != "kernel" or "dur" not in event:
            continue
        stream = int(event.get("args", {}).get("stream", -1))
        start = float(event["ts"])
        spans.setdefault(stream, []).append((start, start + float(event["dur"])))
    return {stream: _merged(found) for stream, found in spans.items()}


def load(path: str | Path) -> dict[int, Intervals]:
    return kernels(json.loads(Path(path).read_text()))


def busy(intervals: Intervals) -> float:
    return sum(end - start for start, end in intervals)


def overlap(a: Intervals, b: Intervals) -> float:
    """Microseconds during which both ``a`` and ``b`` were busy."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            total += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _merged(spans: Intervals) -> Intervals:
    out: Intervals = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
