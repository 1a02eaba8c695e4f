"""The video bench runs and reports what it claims to (behaviour only, never timing).

One tab on each transport for a second, a few frames through each encoder:
real ``rte play`` processes with their own daemons, a real headless Chromium.
"""

from __future__ import annotations

import math

import psutil
import pytest

from tools import bench_video, report

TINY = bench_video.Plan(tabs=(1,), seconds=1.0, settle_s=0.5, encode_frames=10)


def _plays() -> set[int]:
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline[1:4] == ["-m", "rte", "play"] and "--max-sessions" in cmdline:
            found.add(process.pid)
    return found


def test_the_video_bench_measures_both_transports_and_the_encoders(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = _plays()
    result = bench_video.run(TINY)
    assert _plays() <= before, "the bench left an rte play running"
    rows = {row["transport"]: row for row in result["rows"]}
    assert sorted(rows) == ["webrtc", "websocket"] and result["rows"][0]["tabs"] == 1
    for transport, row in rows.items():
        assert row["fps_p50"] > 0 and row["kbytes_per_s"] > 0, row
        assert 0 < row["age_p50_ms"] <= row["age_p95_ms"] < 10_000, row
        assert row["cpu_pct"] > 0 and row["rss_mb"] > 10, row
        assert (row["codec"] == "raw") == (transport == "websocket"), row
    assert rows["webrtc"]["codec"] in ("VP8", "H264"), rows["webrtc"]
    assert rows["webrtc"]["decode_ms"] is not None
    (ratio,) = result["ratios"]
    assert ratio["tabs"] == 1 and math.isclose(
        ratio["bytes_x"], rows["webrtc"]["kbytes_per_s"] / rows["websocket"]["kbytes_per_s"]
    )
    assert [row["codec"] for row in result["encode"]] == ["VP8", "H264"]
    for row in result["encode"]:
        assert row["size"] == "256x288" and 0 < row["encode_p50_ms"] <= row["encode_p99_ms"]
        assert row["bytes_per_frame"] > 0
    report.print_tables(result, bench_video.TABLES)
    printed = capsys.readouterr().out
    assert "WebRTC over the WebSocket" in printed and "encode time per frame" in printed
