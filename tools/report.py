"""What every benchmark shares: windows, summaries, progress lines, tables, JSON, plot.

A suite repeats each measurement in ``n`` windows (:func:`windows`, default
:data:`DEFAULT_WINDOWS`), each window giving a dict of figures, and reports
per figure the median over windows and its spread (:func:`summarize`).

The spread is half the range over windows relative to the median, in percent:
``(max - min) / 2 / |median| * 100``. "±4%" says the windows spanned about 8%
of the median from the lowest to the highest; it is ``None`` where the median
is 0. It is a measure of how repeatable a figure was in this run, not a
confidence interval.

Not run on its own; the suites import it (``python -m tools.bench`` runs them).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

DEFAULT_WINDOWS = 5

T = TypeVar("T")


def percentiles_us(samples_ns: Sequence[int] | np.ndarray[Any, Any]) -> dict[str, float]:
    """p50, p99 and mean of nanosecond samples, in microseconds."""
    a = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return {
        "p50_us": float(np.percentile(a, 50)),
        "p99_us": float(np.percentile(a, 99)),
        "mean_us": float(a.mean()),
    }


def windows(measure: Callable[[], T], n: int) -> list[T]:
    """Run ``measure`` ``n`` times (each run one window) and return every window's result."""
    if n < 1:
        raise ValueError(f"windows: need at least 1, got {n}")
    return [measure() for _ in range(n)]


def spread(values: Sequence[float]) -> float | None:
    """Half the range of ``values`` as a percentage of their median (None if it is 0)."""
    middle = statistics.median(values)
    if middle == 0:
        return None
    return (max(values) - min(values)) / 2 / abs(middle) * 100


def summarize(
    per_window: Sequence[Mapping[str, float]], spread_of: Iterable[str] | None = None
) -> dict[str, float | None]:
    """The median over windows of every figure, and ``<figure>_spread`` (see
    :func:`spread`) for the figures in ``spread_of`` (default: all of them)."""
    if not per_window:
        raise ValueError("summarize: no windows")
    keys = list(per_window[0])
    out: dict[str, float | None] = {}
    for key in keys:
        out[key] = float(statistics.median(w[key] for w in per_window))
    for key in keys if spread_of is None else spread_of:
        out[f"{key}_spread"] = spread([w[key] for w in per_window])
    return out


def fmt_spread(value: float | None) -> str:
    """``±4.2%``, ``±12%``, ``±>999%``; empty for None."""
    if value is None:
        return ""
    if value >= 1000:
        return "±>999%"
    return f"±{value:.1f}%" if value < 10 else f"±{value:.0f}%"


def progress(suite: str, done: int, total: int, text: str) -> None:
    """One line on stderr as a suite goes: ``engine: 1/3 sessions=1 ...``."""
    print(f"{suite}: {done}/{total} {text}", file=sys.stderr, flush=True)


class Progress:
    """A suite's items, each measured in windows and announced on stderr when done."""

    def __init__(self, suite: str, total: int) -> None:
        self.suite, self.total, self.done = suite, total, 0

    def measure(
        self, what: str, measure: Callable[[], Mapping[str, float]], n: int, key: str, unit: str
    ) -> dict[str, float | None]:
        """:func:`summarize` ``n`` windows of ``measure``; one line shows ``key``."""
        began = time.monotonic()
        summary = summarize(windows(measure, n))
        self.done += 1
        value = f"{summary[key]:,.2f} {unit} {fmt_spread(summary[f'{key}_spread'])}"
        text = f"{what}: {key} {value} ({time.monotonic() - began:.1f} s)"
        progress(self.suite, self.done, self.total, text)
        return summary


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}"


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """A plain aligned table; floats with 2 decimals (3 significant below 1). A
    column whose ``<column>_spread`` is in a row shows it after the value."""

    def cell(row: dict[str, Any], column: str) -> str:
        v = row.get(column, "")
        text = f"{v:.3g}" if isinstance(v, float) and abs(v) < 1 else str(v)
        if isinstance(v, float) and abs(v) >= 1:
            text = f"{v:,.2f}"
        if v is None:
            text = ""
        s = fmt_spread(row.get(f"{column}_spread"))
        return f"{text} {s}" if s else text

    body = [[cell(r, c) for c in columns] for r in rows]
    widths = [max([len(c), *(len(b[i]) for b in body)]) for i, c in enumerate(columns)]
    print(title)
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for b in body:
        print("  ".join(v.rjust(w) for v, w in zip(b, widths, strict=True)))
    print()


# (title, the result's list of rows, what a row must hold to be in it, columns)
TableSpec = tuple[str, str, dict[str, Any], list[str]]


def print_tables(result: dict[str, Any], specs: list[TableSpec]) -> None:
    """A suite's tables (see :data:`TableSpec`), each titled with its windows."""
    for title, key, where, columns in specs:
        rows = [r for r in result[key] if all(r.get(k) == v for k, v in where.items())]
        if rows:
            what = f"median over {result['windows']} windows, ±half-range"
            print_table(f"{title}; {what}", rows, columns)


def print_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))


def emit(result: dict[str, Any], specs: list[TableSpec], as_json: bool) -> None:
    """A suite's result as JSON (``--json``) or as its tables."""
    if as_json:
        print_json(result)
    else:
        print_tables(result, specs)


def check_plotting() -> None:
    """SystemExit, saying what to install, when matplotlib is missing (before a
    suite runs for minutes only to fail at the end)."""
    try:
        import matplotlib  # noqa: F401, PLC0415 (optional)
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install -e '.[plot]'") from None


def plot_latency(result: dict[str, Any], path: str) -> None:
    """The e2e suite's p50/p99 in process and through the daemon per sessions, one
    panel per mode, on a log y axis (needs matplotlib)."""
    check_plotting()
    import matplotlib  # noqa: PLC0415 (optional)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    modes = list(dict.fromkeys(r["mode"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        rows = [r for r in result["rows"] if r["mode"] == mode]
        x = [r["sessions"] for r in rows]
        for side, color in [("inproc", "tab:blue"), ("daemon", "tab:red")]:
            for q, style in [("p50", "-o"), ("p99", ":^")]:
                y = [r[f"{side}_{q}_us"] for r in rows]
                ax.plot(x, y, style, color=color, label=f"{side} {q}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(x, [str(v) for v in x])
        ax.set_xlabel("sessions")
        ax.set_ylabel("action to chunk, µs (log)")
        ax.set_title(mode + (f" ({result['pace_hz']:g} Hz)" if mode == "paced" else ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("rte: in-process callback vs daemon over shared memory")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
