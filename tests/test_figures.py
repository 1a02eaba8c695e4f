"""Per-session real-time figures: what they count, on made-up emission times."""

from __future__ import annotations

import array

import numpy as np
import pytest

from rte.ipc.figures import SessionFigures, Word, _buckets, size
from rte.protocol import latency
from shm.native import lib

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


def _counted_one_step_at_a_time(
    f: SessionFigures, handles: np.ndarray, now_ns: int, applied: list[int] | None
) -> None:
    """The reference: one step's update, counted at once (the figures before they
    were kept and counted together)."""
    w = f.words
    last = w[handles, 3]  # LAST_NS
    first = last == 0
    gaps = np.where(first, 0, now_ns - last)
    w[handles, 5] += gaps <= f._late_ns  # ON_TIME
    w[handles, 6] = np.maximum(w[handles, 6], gaps)  # LONGEST_GAP_NS
    w[handles, 3] = now_ns
    w[handles, 4] += 1  # CHUNKS
    w[handles[first], 2] = now_ns  # FIRST_NS
    if (~first).any():
        np.add.at(f.gaps, (handles[~first], _buckets(gaps[~first])), 1)
    if applied is not None:
        seqs = np.asarray(applied, np.int64)
        pending = w[handles, 8]
        done = (pending > 0) & (seqs >= pending)
        which = handles[done]
        np.add.at(f.photons, (which, _buckets(now_ns - w[which, 9])), 1)
        w[which, 10] += 1
        w[which, 8] = 0


@pytest.mark.parametrize("seed", range(6))
def test_steps_counted_together_are_the_figures_of_one_update_per_step(seed: int) -> None:
    """Kept steps counted in one flush (whatever they hold: repeated handles, first
    chunks, receipts, actions between them) give exactly the per-step figures."""
    rng = np.random.default_rng(seed)
    kept, reference = _figures(16), _figures(16)
    now, seq = T0, 0
    for f in (kept, reference):
        for h in range(12):
            f.bound(h, f"s{h}", T0)
    for _ in range(300):
        now += int(rng.integers(1, 3 * P))
        handles = np.sort(rng.choice(12, size=int(rng.integers(1, 12)), replace=False))
        applied = (
            None if rng.random() < 0.3 else [int(v) for v in rng.integers(0, seq + 2, len(handles))]
        )
        kept.emitted(handles, now, applied)
        _counted_one_step_at_a_time(reference, handles, now, applied)
        for _ in range(int(rng.integers(0, 3)) if rng.random() < 0.4 else 0):
            seq += 1  # actions between steps (a few at once): counted in order
            h = int(rng.integers(0, 12))
            kept.acted(h, seq, now + 1)
            reference.words[h, 8:10] = (
                (seq, now + 1) if reference.words[h, 8] == 0 else reference.words[h, 8:10]
            )
        if rng.random() < 0.05:  # a flush now and then, as the daemon's waits make
            kept.flush()
    kept.flush()
    assert kept.photons.sum() > 0 and kept.gaps.sum() > 1000  # (it counted both)
    assert np.array_equal(kept.words, reference.words)
    assert np.array_equal(kept.gaps, reference.gaps)
    assert np.array_equal(kept.photons, reference.photons)


@pytest.mark.parametrize(("seed", "period"), [(0, P), (1, P), (2, 0), (3, P // 10)])
def test_the_c_counting_each_step_as_it_is_sent_gives_the_numpy_figures(
    seed: int, period: int
) -> None:
    """``count`` (``shm_figures_count``: what the daemon's C writer does as it
    pushes each STEP record) against the NumPy path that keeps steps and counts
    them together: the same words, gaps and photons, with actions, repeated
    first chunks, receipts and no receipts between the steps."""
    rng = np.random.default_rng(seed)
    in_c, kept = _figures(16, period), _figures(16, period)
    now, seq = T0, 0
    for f in (in_c, kept):
        for h in range(12):
            f.bound(h, f"s{h}", T0)
    for k in range(400):
        now += int(rng.integers(1, 3 * (period or P)))
        handles = np.sort(rng.choice(12, size=int(rng.integers(1, 12)), replace=False))
        applied = (
            None if rng.random() < 0.3 else [int(v) for v in rng.integers(0, seq + 2, len(handles))]
        )
        in_c.count(
            array.array("I", handles.tolist()),
            now,
            None if applied is None else array.array("I", applied),
        )
        kept.emitted(handles, now, applied)
        for _ in range(int(rng.integers(0, 3)) if rng.random() < 0.4 else 0):
            seq += 1
            h = int(rng.integers(0, 12))
            in_c.acted(h, seq, now + 1)
            kept.acted(h, seq, now + 1)
        if k == 200:  # a session rebound midway: its figures start afresh in both
            in_c.bound(3, "again", now)
            kept.bound(3, "again", now)
    kept.flush()
    assert in_c.photons.sum() > 0 and in_c.gaps.sum() > 1000  # (it counted both)
    assert np.array_equal(in_c.words, kept.words)
    assert np.array_equal(in_c.gaps, kept.gaps)
    assert np.array_equal(in_c.photons, kept.photons)


def test_the_c_counts_the_words_the_figures_name() -> None:
    """The C's word indices (``enum shm_figure_word``) are :class:`Word`'s, and a
    handle past the figures' is skipped, not written past them."""
    names = ["FIRST_NS", "LAST_NS", "CHUNKS", "ON_TIME", "LONGEST_GAP_NS"]
    for name in [*names, "PENDING_SEQ", "PENDING_NS", "PHOTONS"]:
        assert int(getattr(lib, f"SHM_FIGURE_{name}")) == Word[name]
    f = _figures(4)
    f.count(array.array("I", [4, 1 << 31]), T0)
    assert not f.words.any() and not f.gaps.any()
    f.count(array.array("I", [2]), T0)
    assert int(f.words[2, Word.CHUNKS]) == 1 and int(f.words[2, Word.FIRST_NS]) == T0


def test_an_action_is_kept_with_the_steps_and_times_the_chunk_that_applied_it() -> None:
    """An action received while steps are kept does not count them then (that
    flush per action was a quarter of a flat daemon's time when its client
    acted every few steps); counted later, it times the chunk that applied it,
    not one before it."""
    f = _figures()
    f.bound(0, "a", T0)
    f.emitted(np.array([0]), T0, [0])
    f.acted(0, 1, T0 + 10)
    assert int(f.words[0, 4]) == 0  # the step is still kept: nothing was counted
    f.emitted(np.array([0]), T0 + P, [0])  # emitted after the action, not applying it
    f.emitted(np.array([0]), T0 + 2 * P, [1])  # the one that applied it
    f.acted(0, 2, T0 + 2 * P + 10)  # pending after the last step kept
    f.flush()
    assert int(f.words[0, 4]) == 3 and int(f.words[0, 10]) == 1  # CHUNKS, PHOTONS
    assert f.session(0, T0 + 2 * P)["photon_p50_ms"] == pytest.approx(2 * P / 1e6, rel=0.15)
    assert (int(f.words[0, 8]), int(f.words[0, 9])) == (2, T0 + 2 * P + 10)  # PENDING


def test_kept_steps_are_counted_before_anything_reads_or_rebinds() -> None:
    f = _figures()
    f.bound(0, "a", T0)
    f.emitted(np.array([0]), T0)
    f.emitted(np.array([0]), T0 + P)
    assert f.session(0, T0 + P)["chunks"] == 2  # a read counts what is kept
    f.emitted(np.array([0]), T0 + 2 * P)
    f.bound(0, "b", T0 + 3 * P)  # a new session on the handle: the old one's are its own
    assert f.session(0, T0 + 3 * P)["chunks"] == 0
    f.emitted(np.array([0]), T0 + 4 * P)
    f.flush_stale(T0 + 4 * P + 1)  # kept for 1 ns: not yet
    assert int(f.words[0, 4]) == 0
    f.flush_stale(T0 + 4 * P + 20_000_000)
    assert int(f.words[0, 4]) == 1
