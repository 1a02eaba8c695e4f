"""tools/gpu_check, the GPU path's acceptance test, run here on the simulated lanes.

On a machine with CUDA it runs every section on the GPU; here ``--simulate``
runs the same sections on the CPU with the simulated CUDA lanes, and the parts
that only mean something with kernels (trace parsing, /dev/shm sizing, a
failing section reported beside the others) are checked on their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tools import gpu_check, gpu_trace

torch = pytest.importorskip("torch", reason="needs the torch extra: pip install -e '.[torch]'")


def test_without_cuda_it_says_so_and_exits_0(tmp_path: Path) -> None:
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
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "--simulate", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    result = json.loads(out.read_text())
    assert done.returncode == 0 and result["failed"] == [], result
    sections = result["sections"]
    assert list(sections) == list(gpu_check.SECTIONS)
    assert sections["daemon"]["frames"] >= 5 and sections["daemon"]["worst"] == 0
    assert "device=sim" in sections["daemon"]["ready"]  # the daemon ran the CUDA lanes
    assert sections["solo_vs_batched"]["worst"] == 0  # bit-identical on the CPU
    rates = sections["rates"]["rows"]
    assert [r["sessions"] for r in rates] == [1, 8, 64, 1, 8, 64]
    assert all(r["chunks_per_s"] > 0 and r["step_p99_ms"] >= r["step_p50_ms"] for r in rates)


def test_a_failing_section_is_reported_beside_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(check: Any) -> dict[str, Any]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setitem(gpu_check.SECTIONS, "overlap", broken)
    out = tmp_path / "gpu.json"
    check = gpu_check.Check(torch, simulate=True)
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
