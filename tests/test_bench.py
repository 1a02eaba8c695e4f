"""The benchmarks run and report what they claim to (behaviour only, never timing).

Every suite runs tiny here (2 windows, a few rounds); the whole file takes
seconds. A daemon the e2e suite starts is stopped and its shared memory
removed by the suite itself, even when it fails; the module fixture checks
that nothing of its (unique) name is left.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rte.cli import bench as cli_bench
from rte.composed import ComposedEngine
from shm.names import shm_name, unlink_objects
from tools import (
    bench,
    bench_e2e,
    bench_engine,
    bench_inputs,
    bench_scale,
    bench_transport,
    e2e_inprocess,
    readme_tables,
    report,
)

ENGINE = ["step_p50_us", "step_p99_us", "per_session_us", "floor_p50_us", "overhead_x_floor"]
E2E = ["inproc_p50_us", "inproc_p99_us", "daemon_p50_us", "daemon_p99_us"]
E2E += ["added_p50_us", "added_p99_us", "inproc_chunks_per_s", "daemon_chunks_per_s"]
PACED = ["held_p50_us", "held_p99_us", "client_cpu_pct"]


def _finite(row: dict[str, Any], keys: list[str]) -> None:
    for key in keys:
        assert isinstance(row[key], float) and math.isfinite(row[key]), (key, row.get(key))


@pytest.fixture(scope="module")
def e2e_result() -> Iterator[dict[str, Any]]:
    """One tiny e2e run (both modes, 2 sessions), shared by the tests that read it."""
    prefix = f"t{os.getpid()}x{uuid.uuid4().hex[:10]}"
    try:
        yield bench_e2e.run(
            [2],
            rounds=5,
            n_windows=2,
            paced_rounds=3,
            rate_seconds=0.1,
            paced_seconds=0.15,
            prefix=prefix,
        )
    finally:
        left = unlink_objects(shm_name(prefix))
    assert not left, f"the e2e benchmark left shared memory behind: {left}"


@pytest.fixture(scope="module")
def transport_result() -> dict[str, Any]:
    return bench_transport.run(True, 2, tiny=True)


def test_windows_repeat_a_measurement_and_summaries_take_the_median() -> None:
    calls: list[int] = []

    def measure() -> int:
        calls.append(1)
        return len(calls)

    assert report.windows(measure, 3) == [1, 2, 3]
    with pytest.raises(ValueError):
        report.windows(measure, 0)
    summary = report.summarize([{"a": 1.0, "b": 0.0}, {"a": 3.0, "b": 0.0}, {"a": 2.0, "b": 0.0}])
    assert summary == {"a": 2.0, "b": 0.0, "a_spread": 50.0, "b_spread": None}
    assert report.summarize([{"a": 1.0}], spread_of=[]) == {"a": 1.0}
    assert report.fmt_spread(4.25) == "±4.2%" and report.fmt_spread(None) == ""


def test_engine_benchmark_reports_every_size_and_figure() -> None:
    result = bench_engine.run([1, 4], steps=20, n_windows=2)
    assert result["windows"] == 2
    assert [row["sessions"] for row in result["rows"]] == [1, 4]
    for row in result["rows"]:
        _finite(row, [*ENGINE, "step_x_1_session"])
        assert row["step_p50_us"] > 0 and row["per_session_us"] > 0
        assert row["overhead_x_floor"] > 0
        assert all(f"{key}_spread" in row for key in ENGINE)


@pytest.mark.parametrize("kind", ["floor", "ring-spin-then-block", "slab", "pipe"])
def test_transport_benchmark_peers_exchange(kind: str) -> None:
    latent = (1 << 20) if kind == "slab" else None
    samples = bench_transport._measure(kind, 30, latent, warmup=2)
    assert len(samples) == 30 and min(samples) > 0


def test_transport_benchmark_reports_every_peer(transport_result: dict[str, Any]) -> None:
    small = transport_result["round_trip_64B"]
    kinds = [k for k in bench_transport.SMALL_PEERS if bench_transport._available(k)]
    assert [row["kind"] for row in small] == kinds
    for row in small:
        _finite(row, ["p50_us", "p99_us", "x_floor", "x_ring"])
        assert "p50_us_spread" in row and "p99_us_spread" in row
        if row["kind"] != "floor":
            assert row["records_per_s"] > 0 and "records_per_s_spread" in row
    latent = transport_result["latent_handoff"]
    kinds = [k for k in bench_transport.LATENT_PEERS if bench_transport._available(k)]
    assert [(row["size"], row["kind"]) for row in latent] == [("64 KiB", k) for k in kinds]
    for row in latent:
        _finite(row, ["p50_us", "p99_us", "x_slab"])


def test_end_to_end_benchmark_reports_both_modes(e2e_result: dict[str, Any]) -> None:
    rows = e2e_result["rows"]
    assert [(row["sessions"], row["mode"]) for row in rows] == [(2, "flat"), (2, "paced")]
    for row in rows:
        _finite(row, E2E)
        assert row["inproc_p50_us"] > 0 and row["daemon_p50_us"] > 0
        assert row["inproc_chunks_per_s"] > 0 and row["daemon_chunks_per_s"] > 0
        assert all(f"{key}_spread" in row for key in E2E)
    flat, paced = rows
    assert not any(key in flat for key in PACED)
    _finite(paced, [*PACED, "inproc_held_p50_us", "inproc_held_p99_us", "inproc_cpu_pct"])
    assert paced["held_p50_us"] >= 0 and paced["client_cpu_pct"] >= 0
    assert all(f"{key}_spread" in paced for key in ["held_p50_us", "client_cpu_pct"])


def test_bench_prints_progress_then_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--suite", "engine", "--quick", "--windows", "2", "--json"])
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["windows"] == 2 and set(result) >= {"engine", "machine", "date"}
    assert "e2e" not in result and "transport" not in result
    assert "engine: 1/3 sessions=1" in err and "engine: 3/3 sessions=64" in err


def test_readme_tables_come_from_one_run(
    e2e_result: dict[str, Any],
    transport_result: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = bench_engine.run([1, 4], steps=20, n_windows=2)
    run = {"machine": "m", "date": "d", "windows": 2, "engine": engine, "e2e": e2e_result}
    run["transport"] = transport_result
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(run))
    readme_tables.main([str(path)])
    out = capsys.readouterr().out
    names = ["engine", "e2e flat", "e2e per chunk", "e2e paced", "transport round trip"]
    for name in [*names, "transport latent handoff"]:
        assert f"<!-- {name} -->" in out
    tables = out.split("<!-- ")[2:]
    assert [t.count("\n| 2 |") for t in tables[1:4]] == [1, 1, 1]  # a row per e2e size and mode
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(run)))
    readme_tables.main([])
    assert capsys.readouterr().out == out


def test_plot_writes_a_file_or_says_what_it_needs(
    e2e_result: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "e2e.png"
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        with pytest.raises(SystemExit, match="needs matplotlib"):
            report.plot_latency(e2e_result, str(path))
        return
    report.plot_latency(e2e_result, str(path))
    assert path.stat().st_size > 0


def test_rte_bench_passes_its_options_on(monkeypatch: pytest.MonkeyPatch) -> None:
    commands: list[list[str]] = []

    def call(command: list[str], cwd: Path) -> int:
        commands.append(command)
        return 0

    monkeypatch.setattr(cli_bench.subprocess, "call", call)
    args = argparse.Namespace(suite="e2e", json=True, quick=False, plot=None, windows=7)
    assert cli_bench.run(args) == 0
    (command,) = commands
    assert command[1:] == ["-m", "tools.bench", "--suite", "e2e", "--json", "--windows", "7"]


def test_the_large_input_benchmark_reports_both_ways() -> None:
    prefix = f"t{os.getpid()}x{uuid.uuid4().hex[:10]}"
    try:
        result = bench_inputs.run(rounds=6, n_windows=1, prefix=prefix)
    finally:
        left = unlink_objects(shm_name(prefix))
    assert not left, f"the inputs benchmark left shared memory behind: {left}"
    assert [row["way"] for row in result["rows"]] == ["by_value", "loan"]
    for row in result["rows"]:
        _finite(row, ["inproc_p50_us", "daemon_p50_us", "added_p50_us", "fps_ratio"])
        assert row["inproc_fps"] > 0 and row["daemon_fps"] > 0


def test_the_scale_benchmark_reports_ratios_to_one_daemon() -> None:
    prefix = f"t{os.getpid()}x{uuid.uuid4().hex[:10]}"
    try:
        result = bench_scale.run(
            [1, 2], sessions=2, n_windows=1, rounds=4, seconds=0.1, prefix=prefix
        )
    finally:
        left = unlink_objects(shm_name(prefix))
    assert not left, f"the scale benchmark left shared memory behind: {left}"
    rows = {(r["model"], r["daemons"]): r for r in result["rows"]}
    assert set(rows) == {(m, n) for m in ("null", "reference") for n in (1, 2)}
    assert rows["null", 1]["chunks_x_one"] == 1.0 and rows["null", 2]["sessions"] == 4
    _finite(rows["null", 2], ["chunks_per_s", "chunks_x_one", "p50_us", "p50_x_one", "p99_x_one"])


@pytest.mark.parametrize("suite", ["scale", "realtime"])
def test_rte_bench_runs_every_suite_the_checkout_has(
    suite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []
    monkeypatch.setattr(cli_bench.subprocess, "call", lambda c, cwd: commands.append(c) or 0)
    from rte.cli import main  # noqa: PLC0415

    assert main(["bench", "--suite", suite, "--quick"]) == 0  # was refused by rte's own list
    assert commands[0][1:] == ["-m", "tools.bench", "--suite", suite, "--quick"]
    with pytest.raises(SystemExit) as refused:  # the checkout's list is the one that counts
        bench.main(["--suite", "nosuch"])
    assert refused.value.code == 2


def test_plot_without_matplotlib_is_refused_before_the_suite_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import fails
    monkeypatch.setattr(bench, "run", lambda *a: pytest.fail("the suite ran first"))
    with pytest.raises(SystemExit, match="needs matplotlib"):
        bench.main(["--suite", "e2e", "--plot", "x.png"])


def test_the_real_time_benchmark_reports_every_part_against_its_peer() -> None:
    from tools import bench_realtime  # noqa: PLC0415

    plan = bench_realtime.Plan(
        callers=2,
        cost=6.0,
        max_sessions=6,
        window_s=0.5,
        settle_s=0.3,
        levels=(1.0, 2.0),
        churn_s=2.0,
        lifetime_s=1.0,
        overload_s=(0.5, 1.0, 0.5),
        processes=1,
    )
    result = bench_realtime.run(plan)
    ramp = result["ramp"]
    assert {r["admission"] for r in ramp} == {"realtime", "rows"}
    for row in ramp:
        assert row["admitted"] <= row["offered"]
        if row["admission"] == "rows":
            assert row["admitted"] == row["offered"]  # rows alone never refuse below the rows
    assert result["capacity"] >= 1 and isinstance(result["knee"], int)
    assert [r["admission"] for r in result["churn"]] == ["realtime", "rows"]
    assert {(r["phase"], r["priority"]) for r in result["overload"]} == {
        (p, c) for p in ("before", "during", "after") for c in (0, 2)
    }
    assert [r["layout"] for r in result["processes"]] == ["one daemon per session", "one daemon"]
    for row in result["processes"]:
        assert row["rss_mib"] > 0 and 0 <= row["in_real_time"] <= row["sessions"]
    text = readme_tables.render({"realtime": result})
    for name in ("ramp", "churn", "overload", "processes"):
        assert f"<!-- realtime {name} -->" in text
    assert text.count("\n| realtime |") == 1 + sum(r["admission"] == "realtime" for r in ramp)


def test_on_time_is_a_gap_of_at_most_a_period_and_a_half_over_the_periods_that_passed() -> None:
    from tools.bench_realtime import session_figures  # noqa: PLC0415

    period = 10_000_000
    steady = [k * period for k in range(1, 101)]
    assert session_figures(steady, 0, 100 * period, period)["on_time"] == 1.0
    halved = [k * period for k in range(2, 101, 2)]  # every second tick
    assert session_figures(halved, 0, 100 * period, period)["on_time"] == 0.0
    late = [(k + (k >= 50)) * period for k in range(1, 101)]  # one tick lost: a 2-period gap
    figures = session_figures(late, 0, 100 * period, period)
    assert figures["on_time"] == pytest.approx(96 / 98) and figures["stalls"] == 0
    assert session_figures(steady, 200 * period, 300 * period, period)["on_time"] == 0.0


def test_a_paced_in_process_round_whose_point_falls_past_the_next_tick_is_sent_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round's send point is chosen once. Where a step's chunks are emitted late
    in its period (3 ms after its tick here, as 64 sessions' are on a loaded box)
    and the round's point is late in the period too, the point falls past the next
    tick: that step goes first and the action after it. The point used to be
    chosen again after every step, a period later each time, so the round never
    came and the window waited out 60 s: long enough for the daemon beside it to
    detach the stalled benchmark client's sessions."""
    made = e2e_inprocess._engine

    def late_engine(sessions: int) -> tuple[ComposedEngine, list[str]]:
        engine, names = made(sessions)
        step = engine.step

        def late_step(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.003)
            return step(*args, **kwargs)

        monkeypatch.setattr(engine, "step", late_step)
        return engine, names

    monkeypatch.setattr(e2e_inprocess, "_engine", late_engine)
    monkeypatch.setattr(e2e_inprocess, "action_points", lambda rounds, p: [p * 7 // 8] * rounds)
    began = time.monotonic()
    result = e2e_inprocess.in_process(2, 3, 0.05, 60.0)
    assert len(result["samples"]) == 3
    assert time.monotonic() - began < 30, "the rounds waited out the 60 s deadline"
