"""The tables of docs/benchmarks.md, in markdown, from one ``python -m tools.bench --json`` run.

    python -m tools.bench --json > bench.json && python -m tools.readme_tables bench.json
    python -m tools.bench --json | python -m tools.readme_tables      # or from stdin
    python -m tools.readme_tables bench.json --write docs/benchmarks.md

Prints, for each suite the JSON holds, its tables (engine; e2e flat, per
chunk and paced; transport round trip and latent handoff; the real-time suite's ramp,
churn, overload and processes; the state suite's one), each after an HTML
comment naming it, so that every table comes from the same run. ``--write
FILE`` puts them into FILE instead: each table after its comment is replaced
(and the ``<!-- from one ... -->`` line before a suite's first table says
which run), and nothing else changes, so the prose that reads the tables is
for a person to check. A figure with a spread shows it as ``±x%`` (half the
range over windows, in % of the median; see ``tools.report``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.report import fmt_spread

X = "\N{MULTIPLICATION SIGN}"  # ratios: "<X> floor"

Row = dict[str, Any]


def num(value: float | None) -> str:
    """3 significant figures below 100, whole numbers with separators above."""
    if value is None:
        return ""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def with_spread(row: Row, key: str, scale: float = 1.0, sign: bool = False) -> str:
    value = row[key] * scale
    text = (f"{value:+,.0f}" if abs(value) >= 100 else f"{value:+.1f}") if sign else num(value)
    spread = fmt_spread(row.get(f"{key}_spread"))
    return f"{text} {spread}" if spread else text


def table(header: list[str], rows: list[list[str]], align: str = "") -> str:
    """A markdown table; ``align`` has one letter per column (l, r), default all r."""
    align = align or "r" * len(header)
    marks = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def engine(result: dict[str, Any]) -> str:
    header = [
        "sessions",
        "step p50 µs",
        "step p99 µs",
        "per session µs",
        f"{X} 1 session",
        f"{X} floor",
    ]
    rows = [
        [
            str(r["sessions"]),
            with_spread(r, "step_p50_us"),
            num(r["step_p99_us"]),
            num(r["per_session_us"]),
            num(r["step_x_1_session"]),
            with_spread(r, "overhead_x_floor"),
        ]
        for r in result["rows"]
    ]
    return table(header, rows)


def _pair(r: Row, key: str, scale: float = 1.0, sign: bool = False) -> str:
    """``p50 ±s% / p99`` of ``<key>_p50_us`` and ``<key>_p99_us``."""
    p99 = r[f"{key}_p99_us"] * scale
    p99_text = (f"{p99:+,.0f}" if abs(p99) >= 100 else f"{p99:+.1f}") if sign else num(p99)
    return f"{with_spread(r, f'{key}_p50_us', scale, sign)} / {p99_text}"


def e2e_flat(result: dict[str, Any]) -> str:
    header = ["sessions", "in process p50 / p99 µs", "daemon p50 / p99 µs"]
    header += ["added p50 / p99 µs", "in process chunks/s", "daemon chunks/s"]
    rows = [
        [
            str(r["sessions"]),
            _pair(r, "inproc"),
            _pair(r, "daemon"),
            _pair(r, "added", sign=True),
            with_spread(r, "inproc_chunks_per_s"),
            with_spread(r, "daemon_chunks_per_s"),
        ]
        for r in result["rows"]
        if r["mode"] == "flat"
    ]
    return table(header, rows)


def e2e_per_chunk(result: dict[str, Any]) -> str:
    """Flat, both client APIs against the in-process loop: the batch API
    (``poll_batch``, one release per step) and the per-chunk one (``poll`` and
    ``release`` per chunk, the README's first snippet)."""
    header = ["sessions", "batch API chunks/s", f"batch {X} in process"]
    header += ["per-chunk API chunks/s", f"per-chunk {X} in process"]
    header += ["per-chunk act to chunk p50 / p99 µs"]
    rows = [
        [
            str(r["sessions"]),
            with_spread(r, "daemon_chunks_per_s"),
            with_spread(r, "batch_x"),
            with_spread(r, "chunk_api_chunks_per_s"),
            with_spread(r, "chunk_x"),
            _pair(r, "chunk_api"),
        ]
        for r in result["rows"]
        if r["mode"] == "flat"
    ]
    return table(header, rows)


def e2e_paced(result: dict[str, Any]) -> str:
    header = ["sessions", "in process p50 / p99 ms", "daemon p50 / p99 ms", "added p50 / p99 µs"]
    header += ["held p50 / p99 µs", "chunks/s in process / daemon", "client CPU %"]
    ms = 1e-3
    rows = [
        [
            str(r["sessions"]),
            _pair(r, "inproc", ms),
            _pair(r, "daemon", ms),
            _pair(r, "added", sign=True),
            _pair(r, "held"),
            f"{num(r['inproc_chunks_per_s'])} / {with_spread(r, 'daemon_chunks_per_s')}",
            with_spread(r, "client_cpu_pct"),
        ]
        for r in result["rows"]
        if r["mode"] == "paced"
    ]
    return table(header, rows)


def transport_round_trip(result: dict[str, Any]) -> str:
    header = [
        "64-byte round trip to another process",
        "p50 µs",
        "p99 µs",
        f"{X} floor",
        f"{X} ring",
    ]
    header += ["records/s (pipelined)"]
    rows = [
        [
            r["peer"],
            with_spread(r, "p50_us"),
            num(r["p99_us"]),
            num(r["x_floor"]),
            num(r["x_ring"]),
            with_spread(r, "records_per_s") if "records_per_s" in r else "",
        ]
        for r in result["round_trip_64B"]
    ]
    return table(header, rows, "l" + "r" * 5)


def transport_latent(result: dict[str, Any]) -> str:
    rows: list[Row] = result["latent_handoff"]
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    peers = list(dict.fromkeys(r["kind"] for r in rows))
    cells = {(r["kind"], r["size"]): r for r in rows}
    body = []
    for kind in peers:
        first = cells[(kind, sizes[0])]
        if kind == "slab":
            label = f"{first['peer']} (p50 µs)"
            body.append([label, *(with_spread(cells[(kind, s)], "p50_us") for s in sizes)])
        else:
            body.append(
                [f"{first['peer']} ({X} slab)", *(num(cells[(kind, s)]["x_slab"]) for s in sizes)]
            )
    return table(["handing a latent to another process", *sizes], body, "l" + "r" * len(sizes))


def _cell(value: Any) -> str:
    """Text as it is, whole numbers as whole numbers, the rest by :func:`num`."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return f"{int(value):,}"
    return num(value)


def _columns(rows: list[Row], columns: list[tuple[str, str]]) -> str:
    """A table of ``rows`` by (key, heading); text left, numbers right."""
    cells = [[_cell(r[k]) for k, _ in columns] for r in rows]
    align = "".join("l" if rows and isinstance(rows[0][k], str) else "r" for k, _ in columns)
    return table([h for _, h in columns], cells, align)


def realtime_ramp(result: dict[str, Any]) -> str:
    head = (
        f"published capacity {result['capacity']} (admitted {result['admitted']}), "
        f"knee without admission {result['knee']}"
    )
    columns = [("admission", "admission"), ("published", "published"), ("offered", "offered")]
    columns += [("admitted", "admitted"), ("fps_min", "fps min"), ("fps_median", "fps median")]
    columns += [("on_time_min_pct", "on time min %"), ("on_time_median_pct", "on time median %")]
    columns += [("gap_p99_ms", "gap p99 ms"), ("rows_per_step", "rows/step")]
    return head + "\n\n" + _columns(result["ramp"], columns)


def realtime_churn(result: dict[str, Any]) -> str:
    columns = [("admission", "admission"), ("served", "served"), ("refused", "refused")]
    columns += [("on_time_p1_pct", "on time p1 %"), ("on_time_p50_pct", "on time p50 %")]
    columns += [("ttfc_p50_ms", "first chunk p50 ms"), ("ttfc_p99_ms", "p99 ms")]
    columns += [("photon_p50_ms", "input to photon p50 ms"), ("photon_p95_ms", "p95 ms")]
    columns += [("stalls_per_min", "stalls / session-min")]
    return _columns(result["churn"], columns)


def realtime_overload(result: dict[str, Any]) -> str:
    columns = [("phase", "phase"), ("priority", "priority"), ("sessions", "sessions")]
    columns += [("on_time_pct", "on time %"), ("rate_pct", "rate %")]
    columns += [("reduced_notices", "REDUCED notices")]
    return _columns(result["overload"], columns)


def realtime_processes(result: dict[str, Any]) -> str:
    columns = [("layout", "layout"), ("sessions", "sessions"), ("in_real_time", "in real time")]
    columns += [("on_time_median_pct", "on time median %"), ("rss_mib", "daemons' RSS MiB")]
    return _columns(result["processes"], columns)


def state(result: dict[str, Any]) -> str:
    columns = [("figure", "figure"), ("p50", "p50"), ("p99", "p99"), ("unit", "unit")]
    columns += [("target", "target"), ("met", "met")]
    return _columns(result["rows"], columns)


TABLES: list[tuple[str, str, Callable[[dict[str, Any]], str]]] = [
    ("engine", "engine", engine),
    ("e2e", "e2e flat", e2e_flat),
    ("e2e", "e2e per chunk", e2e_per_chunk),
    ("e2e", "e2e paced", e2e_paced),
    ("transport", "transport round trip", transport_round_trip),
    ("transport", "transport latent handoff", transport_latent),
    ("realtime", "realtime ramp", realtime_ramp),
    ("realtime", "realtime churn", realtime_churn),
    ("realtime", "realtime overload", realtime_overload),
    ("realtime", "realtime processes", realtime_processes),
    ("state", "state", state),
]


def render(run: dict[str, Any]) -> str:
    """Every table the run's JSON has suites for, with a line naming the run first."""
    parts = [
        f"<!-- from one `python -m tools.bench --json` run: {run.get('machine', '?')}, "
        f"{run.get('date', '?')}, {run.get('windows', '?')} windows -->"
    ]
    for suite, name, make in TABLES:
        if suite in run:
            parts.append(f"<!-- {name} -->\n{make(run[suite])}")
    return "\n\n".join(parts) + "\n"


FROM_ONE = "<!-- from one "


def _table_span(lines: list[str], marker: int) -> int:
    """The end (exclusive) of the first table after the line ``marker``."""
    at = marker + 1
    while at < len(lines) and not lines[at].startswith("|"):
        at += 1
    while at < len(lines) and lines[at].startswith("|"):
        at += 1
    return at


def write(path: Path, run: dict[str, Any]) -> list[str]:
    """Replace, in the markdown at ``path``, every table ``run`` has a suite for (the
    lines from its ``<!-- NAME -->`` comment to the end of the table after it) and
    the run's line before each suite's first table; the names of the tables written.

    Raises:
        SystemExit: ``path`` has no comment for one of the run's tables.
    """
    made = render(run).splitlines()
    header = made[0]
    lines = path.read_text().splitlines()
    written: list[str] = []
    first_of_suite: set[str] = set()
    for suite, name, _ in TABLES:
        if suite not in run:
            continue
        marker = f"<!-- {name} -->"
        if marker not in lines:
            raise SystemExit(
                f"readme_tables: {path} has no {marker!r}: add it where the table goes"
            )
        at, new_at = lines.index(marker), made.index(marker)
        lines[at : _table_span(lines, at)] = made[new_at : _table_span(made, new_at)]
        written.append(name)
        if suite not in first_of_suite:
            first_of_suite.add(suite)
            before = [i for i in range(at) if lines[i].startswith(FROM_ONE)]
            if before:
                lines[before[-1]] = header
    path.write_text("\n".join(lines) + "\n")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", default="-", help="the JSON (default: stdin)")
    parser.add_argument(
        "--write", metavar="MARKDOWN", help="replace the tables in this file (docs/benchmarks.md)"
    )
    args = parser.parse_args(argv)
    if args.file == "-":
        run = json.load(sys.stdin)
    else:
        with open(args.file, encoding="utf-8") as f:
            run = json.load(f)
    if not any(suite in run for suite, _, _ in TABLES):
        raise SystemExit(
            "readme_tables: no suite in this JSON; make it with python -m tools.bench --json"
        )
    if args.write:
        names = write(Path(args.write), run)
        print(f"readme_tables: wrote {', '.join(names)} into {args.write}", file=sys.stderr)
        return
    sys.stdout.write(render(run))


if __name__ == "__main__":
    main()
