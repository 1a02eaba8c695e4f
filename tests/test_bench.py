"""The benchmarks run and report what they claim to (behaviour only, never timing)."""

from __future__ import annotations

import pytest

from tools import bench_e2e, bench_engine, bench_transport


def test_engine_benchmark_reports_every_size() -> None:
    result = bench_engine.run([1, 4], steps=20)
    assert [row["sessions"] for row in result["rows"]] == [1, 4]
    for row in result["rows"]:
        assert row["step_p50_us"] > 0 and row["per_session_us"] > 0
        assert row["overhead_x_floor"] > 0


@pytest.mark.parametrize("kind", ["floor", "ring-spin-then-block", "slab", "pipe"])
def test_transport_benchmark_peers_exchange(kind: str) -> None:
    latent = (1 << 20) if kind == "slab" else None
    samples = bench_transport._measure(kind, 30, latent, warmup=2)
    assert len(samples) == 30 and min(samples) > 0


def test_end_to_end_benchmark_measures_both_paths() -> None:
    result = bench_e2e.run([2], rounds=5, rate_seconds=0.2)
    (row,) = result["rows"]
    assert row["sessions"] == 2
    assert row["inproc_p50_us"] > 0 and row["daemon_p50_us"] > 0
    assert row["daemon_chunks_per_s"] > 0
