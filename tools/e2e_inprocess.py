"""The end-to-end bench's in-process side: the engine stepped on this thread.

What :mod:`tools.bench_e2e` compares a daemon against: ``ComposedEngine.step``
(null model) in a loop on this thread that hands each chunk to a callback,
flat out or paced (it sleeps to each tick as ``rte.serve.default_serve``
does), with no client and no process boundary. The pacing helpers (where in a
period each round's action is sent) are shared with the daemon's side, so both
send at the same points.

Not run on its own: ``python -m tools.bench_e2e`` runs it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from rte.composed import ComposedEngine
from rte.contract import Action, StepResult
from rte.models.null import NullModel, tag_of


def _engine(sessions: int) -> tuple[ComposedEngine, list[str]]:
    engine = ComposedEngine(NullModel(sessions), lanes="cpu")
    names = [f"s{i}" for i in range(sessions)]
    for name in names:
        engine.attach(name)
    for _ in range(4):
        engine.step(names)
    return engine, names


def action_points(rounds: int, period_ns: int) -> list[int]:
    """When to send each round's action, in ns after the last emission: ``rounds``
    evenly spaced points of the period, in a fixed shuffled order."""
    order = random.Random(rounds).sample(range(rounds), rounds)
    return [(k * 2 + 1) * period_ns // (2 * rounds) for k in order]


def due_at(anchor_ns: int, phase_ns: int, period_ns: int) -> int:
    at = anchor_ns + phase_ns
    now = time.monotonic_ns()
    while at <= now:  # that point has passed: the same point of a later period
        at += period_ns
    return at


def sleep_until(at_ns: int) -> None:
    if (delay := at_ns - time.monotonic_ns()) > 0:  # never sleep(0): it yields the core
        time.sleep(delay / 1e9)


def in_process(sessions: int, rounds: int, seconds: float, hz: float = 0.0) -> dict[str, Any]:
    """The in-process side of a window. ``samples``: per round, ns from handing the
    action to the engine to the callback (on the stepping thread) seeing the tagged
    chunk; then ``seconds`` of steady stepping: ``rate`` (chunks/s) and, paced,
    ``held`` (emitted to callback, ns per chunk) and ``cpu`` (% of one core).
    ``hz`` 0: flat out, each action at once; else paced, at the points of :func:`action_points`."""
    engine, names = _engine(sessions)
    period = round(1e9 / hz) if hz else 0
    phases = action_points(rounds, period) if period else [0] * rounds
    samples: list[int] = []
    held: list[int] = []
    state = {"sent": 0, "anchor": time.monotonic_ns(), "count": 0}
    actions: dict[str, Action] = {}
    next_tick = time.monotonic_ns()

    def step(callback: Callable[[StepResult], None]) -> None:
        nonlocal next_tick, actions
        sleep_until(next_tick)
        results = engine.step(names, actions)
        actions = {}
        for result in results:
            if result.has_chunk:
                callback(result)
        next_tick = max(next_tick + period, time.monotonic_ns())  # late: no catching up

    def round_callback(result: StepResult) -> None:
        r = len(samples)
        assert result.latent is not None
        if state["sent"] and result.session == names[r % sessions] and tag_of(result.latent) == r:
            samples.append(time.monotonic_ns() - state["sent"])
            state["sent"], state["anchor"] = 0, result.timing.emitted_ns

    def count_callback(result: StepResult) -> None:
        state["count"] += 1
        if period:
            held.append(time.monotonic_ns() - result.timing.emitted_ns)

    try:
        deadline = time.monotonic() + 60
        at: int | None = None  # this round's send point, chosen once (it must not move)
        while len(samples) < rounds and time.monotonic() < deadline:
            r = len(samples)
            if not state["sent"]:
                if at is None:
                    at = due_at(state["anchor"], phases[r], period) if period else 0
                if at < next_tick:  # before the next step, else after it
                    sleep_until(at)
                    state["sent"], at = time.monotonic_ns(), None
                    actions = {names[r % sessions]: Action({"tag": r})}
            step(round_callback)
        if len(samples) < rounds:
            raise RuntimeError(f"in process: {len(samples)} of {rounds} actions seen in 60 s")
        cpu, began = time.process_time(), time.monotonic()
        while time.monotonic() - began < seconds:
            step(count_callback)
        elapsed = time.monotonic() - began
        cpu_pct = (time.process_time() - cpu) / elapsed * 100
    finally:
        engine.close()
    return {"samples": samples, "rate": state["count"] / elapsed, "held": held, "cpu": cpu_pct}
