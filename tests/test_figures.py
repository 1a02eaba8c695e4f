"""Per-session real-time figures: what they count, on made-up emission times."""

from __future__ import annotations

import numpy as np
import pytest

from rte.ipc.figures import SessionFigures, _buckets, size
from rte.protocol import latency

P = 33_333_333  # 30 Hz, in ns
T0 = 10**12


def _figures(handles: int = 4, period: int = P) -> SessionFigures:
    return SessionFigures(bytearray(size(handles)), handles, period)


def test_a_session_served_every_tick_is_all_on_time() -> None:
    f = _figures()
    f.bound(1, "steady", T0 - 50_000_000)
    for k in range(30):
        f.emitted(np.array([1]), T0 + k * P + (k % 3) * 1_000_000)  # a little jitter
    got = f.session(1, T0 + 29 * P)
    assert got["session"] == "steady" and got["chunks"] == 30 and got["live"]
    assert got["on_time_pct"] == pytest.approx(100.0)
    assert got["ttfc_ms"] == pytest.approx(50.0)
    assert got["longest_stall_ms"] < 3
    assert 30 <= got["gap_p50_ms"] <= 33.4 * 1.26  # a bucket is at most ~19% wide


def test_a_session_at_half_its_rate_is_half_on_time_and_its_stall_is_counted() -> None:
    f = _figures()
    f.bound(0, "halved", T0)
    for k in range(0, 40, 2):  # every second tick
        f.emitted(np.array([0]), T0 + k * P)
    f.emitted(np.array([0]), T0 + 45 * P)  # then a gap of 7 periods
    got = f.session(0, T0 + 45 * P)
    assert 0 < got["on_time_pct"] < 10  # only the first chunk had a gap <= 1.5 periods
    assert got["longest_stall_ms"] == pytest.approx(6 * P / 1e6)


def test_one_update_serves_a_steps_handles_and_leaves_the_others() -> None:
    f = _figures()
    for h in (0, 2, 3):
        f.bound(h, f"s{h}", T0)
    f.emitted(np.array([0, 3]), T0)
    f.emitted(np.array([0, 3]), T0 + P)
    assert [f.session(h, T0 + P)["chunks"] for h in (0, 2, 3)] == [2, 0, 2]
    assert [s["session"] for s in f.sessions(T0 + P)] == ["s0", "s2", "s3"]


def test_input_to_photon_times_the_oldest_action_to_the_chunk_that_applied_it() -> None:
    f = _figures()
    f.bound(1, "mover", T0)
    f.acted(1, 7, T0)
    f.acted(1, 8, T0 + 1_000_000)  # a later action while 7 is pending: not timed
    f.applied(np.array([1]), np.array([6]), T0 + P)  # not yet
    f.applied(np.array([1]), np.array([8]), T0 + 2 * P)  # 7 (and 8) applied
    got = f.session(1, T0 + 2 * P)
    assert got["photon_p50_ms"] == pytest.approx(2 * P / 1e6, rel=0.2)
    f.acted(1, 9, T0 + 3 * P)  # timed again once the last was seen
    f.applied(np.array([1]), np.array([9]), T0 + 4 * P)
    assert int(f.words[1, 10]) == 2  # PHOTONS


def test_a_handle_bound_again_starts_afresh_and_a_gone_one_stays_readable() -> None:
    f = _figures()
    f.bound(0, "first", T0)
    f.emitted(np.array([0]), T0)
    f.unbound(0)
    assert f.session(0, T0 + 10 * P)["live"] is False
    assert f.session(0, T0 + 10 * P)["on_time_pct"] == pytest.approx(100.0)  # to its end
    f.bound(0, "second" * 20, T0 + 11 * P)  # a long name is cut, never overflows
    got = f.session(0, T0 + 11 * P)
    assert got["chunks"] == 0 and got["session"].startswith("second")


def test_unpaced_figures_count_every_chunk_on_time() -> None:
    f = _figures(period=0)
    f.bound(0, "flat", T0)
    for k in range(5):
        f.emitted(np.array([0]), T0 + k * 10**9)
    assert f.session(0, T0 + 5 * 10**9)["on_time_pct"] == pytest.approx(100.0)


def test_the_vectorised_buckets_are_the_histograms_buckets() -> None:
    values = np.random.default_rng(1).integers(0, 2**42, 5000)
    assert _buckets(values).tolist() == [latency.bucket(int(v)) for v in values]


def test_a_reader_cannot_write() -> None:
    buffer = bytearray(size(2))
    reader = SessionFigures(buffer, 2, P, readonly=True)
    with pytest.raises(ValueError, match="read-only"):
        reader.words[0, 0] = 1
