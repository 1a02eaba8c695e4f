"""tools/gpu_check, the GPU path's acceptance test, run here on the simulated lanes.

On a machine with CUDA it runs every section on the GPU; here ``--simulate``
runs the same sections on the CPU with the simulated CUDA lanes, and the parts
that only mean something with kernels (trace parsing, /dev/shm sizing, a
failing section reported beside the others) are checked on their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tools import gpu_check, gpu_trace, gpu_verdicts

ROOT = Path(__file__).resolve().parents[1]


def needs_torch() -> Any:
    """torch, or a skip: the verdicts and the prepare script are tested without it."""
    return pytest.importorskip("torch", reason="needs the torch extra: pip install -e '.[torch]'")


def test_without_cuda_it_says_so_and_exits_0(tmp_path: Path) -> None:
    torch = needs_torch()
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cuda"] is False
    assert json.loads(out.read_text())["cuda"] is False


def test_every_section_runs_and_reports_on_the_simulated_lanes(tmp_path: Path) -> None:
    needs_torch()
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "--simulate", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    result = json.loads(out.read_text())
    assert done.returncode == 0 and result["failed"] == [], result
    sections = result["sections"]
    assert list(sections) == gpu_check.ORDER
    assert sections["daemon"]["in_process"]["frames"] >= 5
    assert sections["daemon"]["in_process"]["worst"] == 0
    assert "device=sim" in sections["daemon"]["ready"]  # the daemon ran the CUDA lanes
    assert sections["solo_vs_batched"]["worst"] == 0  # bit-identical on the CPU
    assert sections["world"]["worst"] <= gpu_verdicts.WORLD_LEVELS
    rates = sections["rates"]["rows"]
    assert [r["sessions"] for r in rates] == [1, 8, 64] * 3
    assert [r["publish"] for r in rates] == ["wait"] * 6 + ["fenced"] * 3
    assert all(r["chunks_per_s"] > 0 and r["step_p99_ms"] >= r["step_p50_ms"] for r in rates)
    assert all(r["t_host_steps"] > 0 and r["t_host_ms"] >= 0 for r in rates)  # kept by the engine


def test_isolated_sections_each_run_in_a_process_of_their_own_and_report(
    tmp_path: Path,
) -> None:
    """--isolate (what gpu_run.sh runs): a section per process, one JSON, a table."""
    needs_torch()
    out, log = tmp_path / "gpu.json", tmp_path / "sections.log"
    command = [sys.executable, "-m", "tools.gpu_check", "--simulate", "--isolate"]
    command += ["--only", "solo_vs_batched", "pinned_copy", "--budget", "200"]
    command += ["--out", str(out), "--log", str(log)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=260, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert list(result["sections"]) == ["solo_vs_batched", "pinned_copy"]
    assert "solo_vs_batched  ok" in done.stdout and "pinned_copy      skip" in done.stdout


def test_a_section_the_budget_cannot_hold_is_reported_not_run(tmp_path: Path) -> None:
    torch = needs_torch()
    check = gpu_check.Check(torch, simulate=True)
    result = gpu_check.run_isolated(check, ["solo_vs_batched"], tmp_path / "g.json", 1.0, None)
    assert result["failed"] == ["solo_vs_batched"]
    assert "not run" in result["sections"]["solo_vs_batched"]["error"]


def test_a_failing_section_is_reported_beside_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(check: Any) -> dict[str, Any]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setitem(gpu_check.SECTIONS, "overlap", broken)
    out = tmp_path / "gpu.json"
    check = gpu_check.Check(needs_torch(), simulate=True)
    result = gpu_check.run_sections(check, ["overlap", "solo_vs_batched"], out)
    assert result["failed"] == ["overlap"]
    assert "illegal memory access" in result["sections"]["overlap"]["error"]
    assert result["sections"]["solo_vs_batched"]["ok"]
    assert json.loads(out.read_text()) == result  # written as it went


def test_overlap_is_measured_from_kernel_intervals_per_stream() -> None:
    def kernel(stream: int, ts: float, dur: float) -> dict[str, Any]:
        return {"cat": "kernel", "ts": ts, "dur": dur, "args": {"stream": stream}}

    trace = {
        "traceEvents": [
            kernel(7, 0, 10),
            kernel(7, 5, 10),  # merged with the first: 0..15
            kernel(7, 40, 10),
            kernel(13, 12, 20),  # overlaps 12..15 and nothing after
            {"cat": "cpu_op", "ts": 0, "dur": 100},
        ]
    }
    streams = gpu_trace.kernels(trace)
    assert streams == {7: [(0.0, 15.0), (40.0, 50.0)], 13: [(12.0, 32.0)]}
    assert gpu_trace.busy(streams[7]) == 25.0
    assert gpu_trace.overlap(streams[7], streams[13]) == 3.0
    assert gpu_trace.overlap(streams[13], streams[7]) == 3.0


def test_the_copy_test_fits_what_dev_shm_has_free() -> None:
    budget = gpu_check.shm_budget()
    assert budget % (1 << 20) == 0 and (8 << 20) <= budget <= (256 << 20)


# -- each verdict fails a measurement that misses its goal --------------------------


def test_overlap_fails_a_step_slower_than_the_slower_lane_or_without_graphs() -> None:
    good = {"sessions": 8, "graphs": True, "graph_failure": None}
    good |= {"step_ms": 1.05, "hot_alone_ms": 1.0, "deferred_alone_ms": 0.6}
    assert gpu_verdicts.overlap({"rows": [dict(good)]})["ok"]
    serial = good | {"step_ms": 1.6}  # HOT + DEFERRED: no overlap
    verdict = gpu_verdicts.overlap({"rows": [serial]})
    assert not verdict["ok"] and "do not overlap" in verdict["failed"][0]
    eager = good | {"graphs": False, "graph_failure": "RuntimeError: capture"}
    assert not gpu_verdicts.overlap({"rows": [eager]})["ok"]
    assert not gpu_verdicts.overlap({"rows": []})["ok"]


def test_rates_fail_a_graph_failure_a_step_without_chunks_and_no_t_host() -> None:
    row = {"sessions": 8, "asked_graphs": True, "graphs": True, "graph_failure": None}
    row |= {"chunks_per_s": 100.0, "step_p50_ms": 1.0, "step_p99_ms": 2.0}
    row |= {"publish": "fenced", "t_host_ms": 0.05, "t_host_steps": 40}
    assert gpu_verdicts.rates({"rows": [dict(row)]})["ok"]
    untimed = gpu_verdicts.rates({"rows": [row | {"t_host_steps": 0}]})
    assert not untimed["ok"] and "fenced: the engine kept no t_host" in untimed["failed"][0]
    failed = row | {"graphs": False, "graph_failure": "RuntimeError: capture failed"}
    assert not gpu_verdicts.rates({"rows": [failed]})["ok"]
    assert not gpu_verdicts.rates({"rows": [row | {"chunks_per_s": 0.0}]})["ok"]


def test_sync_free_fails_a_sync_eager_steps_and_a_pageable_copy() -> None:
    pinned = {gpu_verdicts.PINNED_COPY: 20}
    good = {"steps": 20, "error": None, "graph_replays": 20, "copies": pinned}
    assert gpu_verdicts.sync_free({"scenarios": {"heap": dict(good)}})["ok"]
    for bad in (
        good | {"error": "RuntimeError: called a synchronizing CUDA operation"},
        good | {"graph_replays": 0},
        good | {"copies": {**pinned, "Memcpy DtoH (Device -> Pageable)": 20}},
        good | {"copies": {}},
    ):
        assert not gpu_verdicts.sync_free({"scenarios": {"s": bad}})["ok"], bad


def test_pinned_copy_fails_under_80_percent_of_a_host_alloc_buffer() -> None:
    good = {"slab_pinned": True, "view_is_pinned": True, "copy_returned_before_done": True}
    fast = {"196608": {"slab_gb_s": 9.0, "host_alloc_gb_s": 10.0}}
    assert gpu_verdicts.pinned_copy(good | {"sizes": fast})["ok"]
    slow = {"196608": {"slab_gb_s": 7.0, "host_alloc_gb_s": 10.0}}
    verdict = gpu_verdicts.pinned_copy(good | {"sizes": slow})
    assert not verdict["ok"] and "70%" in verdict["failed"][0]
    blocking = good | {"copy_returned_before_done": False, "sizes": fast}
    assert not gpu_verdicts.pinned_copy(blocking)["ok"]


def test_frame_comparisons_fail_one_level_where_zero_is_the_goal() -> None:
    assert gpu_verdicts.compared({"worst": 0, "frames": 24}, 0, "solo vs batched")["ok"]
    assert not gpu_verdicts.compared({"worst": 1, "frames": 24}, 0, "solo vs batched")["ok"]
    assert not gpu_verdicts.compared({"worst": 0, "frames": 2}, 0, "too few")["ok"]
    same = {"runs": {"hot": {"worst": 0, "frames": 40}}}
    assert gpu_verdicts.stretched(same)["ok"]
    assert not gpu_verdicts.stretched({"runs": {"hot": {"worst": 3, "frames": 40}}})["ok"]
    daemon = {"slab_pinned": True, "clients": 2, "in_process": {"worst": 0, "frames": 10}}
    daemon["cpu"] = {"worst": 2, "frames": 10}
    assert gpu_verdicts.daemon(daemon)["ok"]
    assert not gpu_verdicts.daemon(daemon | {"in_process": {"worst": 1, "frames": 10}})["ok"]
    assert not gpu_verdicts.daemon(daemon | {"clients": 1})["ok"]
    world = {"worst": 1, "frames": 20, "graphs": True}
    assert gpu_verdicts.world(world)["ok"]
    assert not gpu_verdicts.world(world | {"worst": 2})["ok"]


def test_the_suite_fails_a_failing_gpu_test_but_not_a_budget_cut() -> None:
    passed = {"returncode": 0, "summary": "3 passed", "failed": [], "cut": False}
    cut = {"returncode": -1, "summary": "", "failed": [], "cut": True}
    assert gpu_verdicts.suite({"gpu": passed, "rest": cut})["ok"]
    failing = {"returncode": 1, "summary": "1 failed", "failed": ["FAILED x"], "cut": False}
    assert not gpu_verdicts.suite({"gpu": failing, "rest": None})["ok"]
    assert not gpu_verdicts.suite({"gpu": passed, "rest": failing})["ok"]


# -- the first run, prepared ---------------------------------------------------------


def gpu_prepare(flag: str, folder: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``tools/gpu_prepare.sh FLAG`` (its wheel folder ``folder``, else its own)."""
    env = os.environ if folder is None else {**os.environ, "GPU_PREPARE_DIR": str(folder)}
    return subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_prepare.sh"), flag],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_gpu_prepare_dry_run_prints_the_plan_and_downloads_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "gpu"
    done = gpu_prepare("--dry-run", folder=folder)
    assert done.returncode == 0, done.stderr
    for wanted in ("posix_ipc", "cffi", "msgspec", "--python-version 3.12", "--only-binary=:all:"):
        assert wanted in done.stdout
    assert f'carry: ["{folder}"]' in done.stdout and "tools/gpu_run.sh" in done.stdout
    assert not folder.exists()  # nothing was downloaded or built


def test_gpu_prepare_check_says_what_the_wheel_folder_lacks(tmp_path: Path) -> None:
    folder = tmp_path / "gpu"
    (folder / "wheels").mkdir(parents=True)
    (folder / "wheels" / "cffi-2.1.1-cp311-cp311-manylinux2014_x86_64.whl").touch()
    done = gpu_prepare("--check", folder=folder)
    assert done.returncode == 1
    assert "missing: " in done.stdout and "posix_ipc" in done.stdout
    assert "wrong platform" in done.stdout and "_native" in done.stdout


def test_the_prepared_wheel_folder_is_complete_when_present() -> None:
    """Where gpu_prepare.sh has run (its folder is git-ignored), --check passes."""
    if not (ROOT / ".gpu" / "wheels").is_dir():
        pytest.skip("tools/gpu_prepare.sh has not run in this checkout")
    done = gpu_prepare("--check")
    assert done.returncode == 0, done.stdout


def test_encode_fails_a_bystander_touched_a_lost_chunk_and_an_encode_that_did_not_run() -> None:
    bystanders = {"worst": 0, "shared": 30, "lost": 0}
    changed = bystanders | {"encoded": True, "chunks_after": 7, "frames_changed": True}
    good = {"changed": changed, "failing": bystanders | {"session_failed": True}}
    assert gpu_verdicts.encode(good)["ok"]
    for broken, says in [
        ({"changed": changed | {"worst": 1}}, "differ by 1 levels"),
        ({"failing": good["failing"] | {"lost": 2}}, "bystanders lost 2 chunks"),
        ({"changed": changed | {"encoded": False}}, "never went through ENCODE"),
        ({"changed": changed | {"frames_changed": False}}, "did not go on with its new"),
        ({"failing": good["failing"] | {"session_failed": False}}, "was not FAILED"),
        ({"changed": changed | {"shared": 0}}, "no bystander frame"),
    ]:
        verdict = gpu_verdicts.encode(good | broken)
        assert not verdict["ok"] and any(says in f for f in verdict["failed"]), verdict
