"""Unit tests of the real-time pieces: the turn's cost model, the admission rule,
the overload governor, the receipts and the pacer (behaviour, never timing)."""

from __future__ import annotations

import pytest

from rte.contract import NoticeKind, ResultKind, StepResult, Timing
from rte.errors import AdmissionError
from rte.overload import MAX_DIVISOR, OVER_TURNS, UNDER_TURNS, Governor, check_priority
from rte.realtime import MIN_SAMPLES, Pacer, RealTime, StepCost
from rte.receipts import Receipts
from rte.turns import UNPACED_EVERY, Turns


def test_the_cost_model_recovers_a_line_from_varied_turns() -> None:
    cost = StepCost()
    for i in range(200):
        n = 1 + i % 20
        cost.add(n, 0.002 + 0.0005 * n)
    a, b = cost.coefficients()
    assert a == pytest.approx(0.002, rel=0.01)
    assert b == pytest.approx(0.0005, rel=0.01)
    # 30 Hz less 10%: (0.03 - 0.002) / 0.0005 = 56 rows
    assert cost.capacity(0.03) == 56


def test_the_cost_model_knows_nothing_until_it_has_seen_enough_turns() -> None:
    cost = StepCost()
    for _ in range(MIN_SAMPLES - 1):
        cost.add(4, 0.004)
    assert not cost.known and cost.capacity(0.03) is None
    cost.add(4, 0.004)
    assert cost.known and cost.capacity(0.03) is not None


def test_a_steady_cohort_is_fitted_through_the_origin_the_safe_side() -> None:
    cost = StepCost()
    for _ in range(50):
        cost.add(10, 0.010)  # a = 2 ms, b = 0.8 ms really: it cannot tell
    a, b = cost.coefficients()
    assert a == 0.0 and b == pytest.approx(0.001)
    assert cost.capacity(0.03) == 30  # true capacity 35: never over-estimated


def test_one_outlier_moves_the_fit_by_little() -> None:
    cost = StepCost()
    for i in range(60):
        cost.add(1 + i % 10, 0.001 * (1 + i % 10))
    before = cost.predict(10)
    cost.add(10, 5.0)  # a first-step compile
    assert cost.predict(10) < 1.5 * before


def test_real_time_admission_names_the_capacity() -> None:
    rt = RealTime(30, rows=64, margin=0.1)
    rt.admit(1000)  # unknown yet: by rows only
    for i in range(100):
        rt.cost.add(1 + i % 10, 0.003 * (1 + i % 10))
    assert rt.capacity() == 10  # 30 ms (33.3 less 10%) / 3 ms
    rt.admit(9)
    with pytest.raises(AdmissionError, match=r"real-time capacity 10 sessions at 30 Hz reached"):
        rt.admit(10)
    RealTime(30, rows=64, admission="rows").admit(1000)  # rows: never by real time
    assert RealTime(0, rows=64).capacity() is None  # unpaced: no capacity
    with pytest.raises(ValueError, match="admission"):
        RealTime(30, rows=8, admission="fast")


def test_capacity_is_capped_by_the_rows() -> None:
    rt = RealTime(30, rows=4)
    for i in range(20):
        rt.cost.add(1 + i % 4, 1e-5 * (1 + i % 4))
    assert rt.capacity() == 4


def _governor(predicted: float | None = None) -> Governor:
    return Governor(10.0, 0.09, lambda rows: predicted)


def _overload(governor: Governor, turns: int = OVER_TURNS) -> list[str]:
    kinds = []
    for _ in range(turns):
        kinds += [n.kind.name for n in governor.observe(0.2, 6)]
    return kinds


def test_the_lowest_class_slows_first_rotating_and_nobody_below_a_quarter() -> None:
    g = _governor()
    for s in ("hi", "lo0", "lo1", "lo2", "lo3"):
        g.add(s, 0 if s == "hi" else 3)
    notices = []
    for _ in range(OVER_TURNS):
        notices += g.observe(0.2, 5)
    assert {(n.session, n.kind) for n in notices} == {
        (s, NoticeKind.REDUCED) for s in ("lo0", "lo1", "lo2", "lo3")
    }
    assert "every 2nd tick (5 Hz of 10)" in notices[0].message
    assert g.divisor[3] == 2 and g.divisor[0] == 1 and g.reduced() == 4
    due = ["hi", "lo0", "lo1", "lo2", "lo3"]
    picked = [g.pick(due) for _ in range(4)]
    assert all("hi" in p for p in picked)  # the high class keeps its rate
    for p in picked:
        assert len([s for s in p if s.startswith("lo")]) == 2  # half of them each tick
    assert picked[0] != picked[1]  # a different half: rotating, nobody starves
    # still overloaded: the low class to a quarter, then the high class, never below
    for _ in range(20):
        for _ in range(2 * MAX_DIVISOR):
            g.observe(0.2, 5)  # the hold after a change
        _overload(g)
    assert g.divisor[3] == MAX_DIVISOR and g.divisor[0] == MAX_DIVISOR
    g.add("late", 3)  # joining a reduced class: told at once
    assert g.add("late2", 2) == []  # an empty class runs at its full rate


def test_the_reduction_is_undone_stepwise_when_the_load_drops() -> None:
    g = _governor()
    g.add("hi", 0)
    g.add("lo", 3)
    _overload(g)
    for _ in range(2 * MAX_DIVISOR):
        g.observe(0.2, 2)
    _overload(g)
    assert g.divisor[3] == 4
    kinds = []
    for _ in range(2 * MAX_DIVISOR + UNDER_TURNS):
        kinds += [(n.session, n.kind, n.message) for n in g.observe(0.01, 2)]
    assert kinds == [("lo", NoticeKind.RESTORED, kinds[0][2])]
    assert g.divisor[3] == 2 and "2nd tick" in kinds[0][2]
    for _ in range(2 * MAX_DIVISOR + UNDER_TURNS):
        g.observe(0.01, 2)
    assert g.divisor[3] == 1 and g.reduced() == 0
    assert g.pick(["hi", "lo"]) == ["hi", "lo"]


def test_no_restore_while_the_prediction_says_it_would_overload_again() -> None:
    g = _governor(predicted=0.5)  # any turn with the rows restored is over budget
    g.add("lo", 3)
    for _ in range(OVER_TURNS):
        g.observe(0.2, 1)
    for _ in range(2 * MAX_DIVISOR + 3 * UNDER_TURNS):
        assert g.observe(0.01, 0) == []
    assert g.divisor[3] == 2


def test_priorities_are_checked() -> None:
    assert check_priority(0) == 0
    for bad in (-1, 4, 1.5, True):
        with pytest.raises(ValueError, match="priority"):
            check_priority(bad)  # type: ignore[arg-type]


def _result(session: str, chunk: int, kind: ResultKind = ResultKind.CHUNK) -> StepResult:
    return StepResult(session, chunk, kind, None, Timing(0, 0))


def test_receipts_depth_one_apply_at_the_chunk_of_the_step() -> None:
    r = Receipts(pipelined=False)
    assert r.column(["a"], [0]) is None  # nobody acted: nothing to carry
    r.handed([_result("a", 0)], {"a": 7})
    assert r.column(["a"], [0]) == [7]
    r.handed([_result("a", 1, ResultKind.ENCODING)], {"a": 9})  # sat out: the next applies it
    assert r.applied("a", 1) == 9
    r.forget("a")
    assert r.applied("a", 2) == 9  # its finalized chunk still goes out with it
    r.settle()
    assert r.applied("a", 0) == 0


def test_receipts_depth_two_apply_from_the_chunk_generated_at_the_step() -> None:
    r = Receipts(pipelined=True)
    r.handed([_result("a", 1, ResultKind.WARMUP)], {"a": 3})  # first step: made chunk 0
    assert r.applied("a", 0) == 3
    r.handed([_result("a", 0)], {"a": 5})  # emitted 0, made 1 with the action
    assert r.applied("a", 0) == 3
    assert r.applied("a", 1) == 5
    r.handed([_result("a", -1, ResultKind.ERROR)], {"a": 6})  # refused: applies to none
    assert r.applied("a", 2) == 5


def test_a_pacer_that_fell_behind_does_not_burst() -> None:
    pacer = Pacer(1000.0, spin_s=0.0)
    pacer.begin()
    slept: list[float] = []
    pacer.tick -= 1.0  # as if the turn had run a second
    pacer.wait(slept.append)
    assert pacer.missed == 1 and slept == []  # the next turn starts now
    pacer.begin()
    pacer.wait(lambda s: True)  # a sleep cut short (stopping): returns at once
    assert pacer.stats().ticks == 2


def test_rows_that_barely_vary_never_promise_several_times_the_capacity() -> None:
    """Turns of 28 to 31 rows with a little noise: a slope fitted to them can be any
    small number (and the capacity anything); the fit goes through the origin."""
    import random  # noqa: PLC0415

    from rte.realtime import StepCost  # noqa: PLC0415

    truth = (0.030 - 0.001) // 0.00035  # 82 rows fit 30 ms
    for seed in range(10):  # (seed 1 promised 208 with a slope fitted to them)
        rng = random.Random(seed)
        cost = StepCost()
        for k in range(400):
            rows = 28 + k % 4
            cost.add(rows, 0.001 + 0.00035 * rows + rng.uniform(-0.003, 0.003))
        capacity = cost.capacity(0.030)
        assert capacity is not None and capacity <= truth * 1.1, (seed, capacity)


def test_turns_that_fit_reduce_nobody_whatever_the_prediction_says() -> None:
    """The cost model errs on the safe side: near capacity it predicts more than
    the turn takes. Judged by it, a cohort whose every turn fitted was reduced,
    and, counting the rows due before the filter, reduced again after the first
    reduction had made the turns short (seen: 58 sessions at a quarter rate)."""
    g = Governor(30.0, 0.03, lambda rows: 0.001 * rows)  # 60 rows "predicted" 60 ms
    for i in range(60):
        g.add(f"s{i}", 1)
    for _ in range(100):
        assert g.observe(0.025, 60) == []  # 25 ms of a 33 ms period: fits
    assert g.divisor[1] == 1
    for _ in range(OVER_TURNS):
        g.observe(0.040, 60)  # past the period: over
    assert g.divisor[1] == 2
    for _ in range(100):
        g.observe(0.020, 30)  # the reduction made the turns short: no further cut
    assert g.divisor[1] == 2


def test_a_slope_fitted_to_noisy_bursts_promises_no_sessions_past_the_line() -> None:
    """Arrivals in bursts (7 rows at a time) with noisy turns: the capacity is taken
    on the pessimistic side of the slope's uncertainty, never past the truth by
    more than the margin the daemon keeps anyway."""
    import random  # noqa: PLC0415

    truth = (0.030 - 0.0015) / 0.00048  # 59 rows
    for seed in range(10):
        rng = random.Random(seed)
        cost, n = StepCost(), 7
        for k in range(600):
            if k % 40 == 0 and n < 56:
                n += 7
            cost.add(n, 0.0015 + 0.00048 * n + rng.uniform(-0.003, 0.003))
            capacity = cost.capacity(0.030)
            assert capacity is None or capacity <= truth * 1.1, (seed, k, n, capacity)


def test_turns_that_already_run_long_refuse_the_next_attach_whatever_the_fit() -> None:
    from rte.realtime import RealTime  # noqa: PLC0415

    rt = RealTime(30.0, 256)
    for _ in range(50):  # 20 rows in 10 ms: the line says 54 fit 30 ms
        rt.cost.add(20, 0.010)
    rt.admit(20)
    for _ in range(10):  # then the same rows take 35 ms (the cores are taken)
        rt.cost.add(20, 0.035)
    with pytest.raises(AdmissionError, match=r"capacity \d+ sessions at 30 Hz reached \(20"):
        rt.admit(20)


def test_a_drained_cohorts_last_long_turns_refuse_nobody_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rte import realtime  # noqa: PLC0415

    rt = realtime.RealTime(30.0, 256)
    for _ in range(50):
        rt.cost.add(20, 0.010)
    for _ in range(10):
        rt.cost.add(20, 0.035)  # the last turns before everyone left ran long
    monkeypatch.setattr(realtime, "RECENT_FOR_S", 0.0)  # ... a while ago
    rt.admit(0)  # (it refused every attach for good: nothing stepped to refresh them)


def test_a_paced_host_fits_every_turn_an_unpaced_one_a_sample_of_them() -> None:
    """Paced, admission and the governor rest on every turn's cost; unpaced, the fit
    is only published, from every UNPACED_EVERY-th turn that stepped (and none that
    stepped nothing)."""
    paced, unpaced = Turns(60, 8, "realtime", 0.1), Turns(0, 8, "realtime", 0.1)
    for turns in (paced, unpaced):
        for n in range(8 * UNPACED_EVERY):
            turns.begin()
            turns.stepped = 0 if n % 2 else 4  # every other turn steps nothing
            turns.end()
    assert paced.realtime.cost.samples == 4 * UNPACED_EVERY
    assert unpaced.realtime.cost.samples == 4
    assert unpaced.realtime.cost.coefficients()[1] > 0  # it knows the cost all the same
