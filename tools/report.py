"""Timing statistics and the table/JSON output every benchmark prints."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np


def percentiles_us(samples_ns: Sequence[int] | np.ndarray[Any, Any]) -> dict[str, float]:
    """p50, p99 and mean of nanosecond samples, in microseconds."""
    a = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return {
        "p50_us": float(np.percentile(a, 50)),
        "p99_us": float(np.percentile(a, 99)),
        "mean_us": float(a.mean()),
    }


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """A plain aligned table; floats with 2 decimals (3 significant below 1)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1 else f"{v:,.2f}"
        return str(v)

    body = [[cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(columns)]
    print(title)
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for b in body:
        print("  ".join(v.rjust(w) for v, w in zip(b, widths, strict=True)))
    print()


def print_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))
