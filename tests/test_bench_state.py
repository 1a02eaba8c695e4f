"""The state bench runs end to end and reports what it claims to (behaviour only,
never timing): ``rte bench --suite state --quick --json``, real daemons of the
world model at 30 Hz, two real drain client processes, a real SIGKILL."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import psutil
import pytest

from shm.names import shm_name, unlink_objects
from tools import bench, bench_state, readme_tables, report

FIGURES = [
    "suspend call",
    "resume call",
    "suspend+resume stall",
    "migrate call",
    "migration stall",
    "drain 8 sessions, 2 clients",
    "drain stall per session",
    "rte drain 8 sessions, 2 clients",
    "rte drain stall per session",
    "checkpoint per step, K=30",
    "checkpoint bytes per session",
    "replay flat out",
    "crash: chunks lost, K=30",
]


def _children() -> set[int]:
    """This process's children but multiprocessing's resource tracker (it stays)."""
    found = set()
    for process in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(process.cmdline()):
                found.add(process.pid)
        except psutil.NoSuchProcess:  # it ended meanwhile
            continue
    return found


def _finite_pair(part: dict[str, Any], figure: str) -> None:
    p50, p99 = bench_state.pair(part, figure)
    assert math.isfinite(p99) and 0 < p50 <= p99, (figure, part)


def test_the_quick_state_bench_measures_every_part_and_cleans_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = _children()
    bench.main(["--suite", "state", "--quick", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert _children() <= before, "the bench left a daemon or a drain client running"
    assert unlink_objects(shm_name(f"bench-state-{os.getpid()}")) == [], "shared memory left"
    result = out["state"]
    quick = bench_state.QUICK
    assert out["quick"] and result["pace_hz"] == 30.0 and result["every"] == 30

    suspend, migrate, drain = result["suspend"], result["migrate"], result["drain"]
    for part in (suspend, migrate):  # every chunk came once, none missing
        assert part["gaps"] == 0 and part["repeats"] == 0, part
        _finite_pair(part, "stall_periods")
    for figure in ("suspend_ms", "resume_ms", "suspend_periods", "resume_periods"):
        _finite_pair(suspend, figure)
    _finite_pair(migrate, "call_periods")
    assert suspend["cycles"] == quick.cycles and migrate["moves"] == quick.moves

    for each in (drain, result["rte_drain"]):  # every session moved, no chunk lost or repeated
        assert each["moved"] == each["sessions"] == quick.drain_sessions, each
        assert each["clients"] == 2 and each["gaps"] == 0 and each["repeats"] == 0, each
        assert each["seconds"] > 0
        _finite_pair(each, "stall_periods")

    checkpoint = result["checkpoint"]
    assert checkpoint["every"] == 30 and checkpoint["written"] > 0
    assert 0 < checkpoint["state_bytes"] < checkpoint["slot_bytes"]
    assert checkpoint["share_pct"] > 0

    replay = result["replay"]
    assert replay["identical"] and replay["chunks"] == quick.replay_chunks
    assert replay["x_real_time"] == pytest.approx(replay["chunks_per_s"] / 30.0)

    crash = result["crash"]
    assert len(crash["lost"]) == crash["crashes"] == quick.crashes
    assert all(0 <= lost <= 30 + 3 for lost in crash["lost"]), crash  # K, plus in flight

    rows = result["rows"]
    assert [r["figure"] for r in rows] == FIGURES
    targets = {r["figure"]: (r["target"], r["met"]) for r in rows if r["target"]}
    assert set(targets) == {"migration stall", "checkpoint per step, K=30",
                            "crash: chunks lost, K=30"}  # fmt: skip
    assert all(met in ("yes", "no") for _, met in targets.values())

    report.print_tables(result, bench_state.TABLES)
    printed = capsys.readouterr().out
    assert "A session's world survives" in printed and "migration stall" in printed
    table = readme_tables.render({"state": result})
    assert (
        "<!-- state -->" in table and table.count("\n| ") == len(FIGURES) + 2
    )  # heading, rule, rows
