"""tools.bench_phases, in a short real run: each row's phases are measured through a
real daemon and add up to the whole they split."""

from __future__ import annotations

import pytest

from tools import bench_phases


@pytest.mark.timeout(120)
def test_the_phases_of_an_action_and_of_a_paced_chunk_add_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = bench_phases.run(rounds=30, seconds=0.5, sessions=2, n_windows=1, pace_hz=(60, 500))
    flat, paced, faster = result["rows"]
    assert flat["mode"] == "flat act" and paced["mode"] == faster["mode"] == "paced"
    assert paced["sessions"] == faster["sessions"] == 2
    assert (paced["pace_hz"], faster["pace_hz"]) == (60, 500)  # a row per rate, in order
    for row, parts, whole in (
        (flat, bench_phases.FLAT[:5], "act_to_held"),
        (paced, bench_phases.PACED[:3], "emitted_to_held"),
        (faster, bench_phases.PACED[:3], "emitted_to_held"),
    ):
        assert all(row[p] >= 0 for p in parts), row
        # p50s of parts need not add to the p50 of the whole, but they are of its size
        assert 0.3 * row[whole] <= sum(row[p] for p in parts) <= 3 * row[whole], row
    assert flat["batches"] >= 2  # the chunk in flight comes first: never the first batch
    assert "phases: 3/3 paced 500 Hz" in capsys.readouterr().err
