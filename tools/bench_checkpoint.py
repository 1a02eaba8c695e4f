"""The cost of checkpoints per step (issue 25's target: at most 5% of a step at K = 30).

Runs the daemon's serve loop in this process with the ``world`` model (8
sessions, pipelined) flat out, with and without the checkpoint writer of
:mod:`rte.ipc.checkpoints` (every K steps of each session: suspend, resume,
to_bytes, the write into shared memory), rounds interleaved so the box's noise
falls on both alike; prints each one's mean step (a noisy difference on a busy
box), the time checkpoints themselves took spread over the steps and its share
of a step (the figure to read),
the bytes of one session's state and of its checkpoint slot, and the time of one
checkpoint. :func:`measure` is the figures as a dict (``rte bench --suite state``
reports them: :mod:`tools.bench_state`).

    python -m tools.bench_checkpoint [--every 30] [--sessions 8] [--steps 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from rte import Attach, ComposedEngine, ServeLoop
from rte.ipc.checkpoints import Checkpoints
from rte.models.learned import LearnedWorldModel
from rte.protocol.names import DaemonNames


def run(sessions: int, steps: int, every: int) -> tuple[float, float, int, int, int]:
    """Mean step seconds, mean seconds of one checkpoint, checkpoints written, the
    bytes of a checkpoint slot's half (0 without checkpoints), of one session's state."""
    names = DaemonNames(f"bench-ckpt-{os.getpid()}")
    engine = ComposedEngine(LearnedWorldModel(sessions))
    loop = ServeLoop(engine, admission="rows")
    writer = Checkpoints(names, every, sessions) if every else None
    try:
        for i in range(sessions):
            loop.handle(Attach(f"s{i}", {"prompt": "a forest"}))
        for _ in range(5):  # warm: seeded, encodes done
            loop.step()
            engine.lanes.drain()
        began = time.perf_counter()
        spent = 0.0
        for _ in range(steps):
            due = loop.sessions
            loop.step(due)
            if writer is not None:
                t = time.perf_counter()
                writer.after_step(loop, due)
                spent += time.perf_counter() - t
        elapsed = time.perf_counter() - began
        written = writer.written if writer else 0
        size = writer.slot_bytes if writer else 0
        state = engine.suspend("s0")  # what one session's checkpoint holds, at a boundary
        engine.resume("s0", state)
        return elapsed / steps, spent / max(1, written), written, size, len(state.to_bytes())
    finally:
        if writer is not None:
            writer.close()
        engine.close()


def measure(sessions: int, steps: int, every: int, rounds: int) -> dict[str, Any]:
    """Rounds without and with checkpoints, interleaved; the medians: the step
    without (``step_ms``) and with (``step_with_ms``), one checkpoint
    (``one_ms``), their time spread over the steps (``per_step_ms``) and its share
    of a step (``share_pct``, the figure to read), checkpoints ``written`` per
    run, the bytes of one session's state and of its slot's half."""
    base, with_ckpt, each = [], [], []
    written = slot = state = 0
    for _ in range(rounds):
        base.append(run(sessions, steps, 0)[0])
        step, one, written, slot, state = run(sessions, steps, every)
        with_ckpt.append(step)
        each.append(one)
    b, c, one = statistics.median(base), statistics.median(with_ckpt), statistics.median(each)
    per_step = one * written / steps  # the time checkpoints take, spread over the steps
    return {
        "sessions": sessions,
        "steps": steps,
        "every": every,
        "step_ms": b * 1e3,
        "step_with_ms": c * 1e3,
        "step_added_pct": (c - b) / b * 100,
        "one_ms": one * 1e3,
        "per_step_ms": per_step * 1e3,
        "share_pct": per_step / b * 100,
        "written": written,
        "state_bytes": state,
        "slot_bytes": slot,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=30)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    m = measure(args.sessions, args.steps, args.every, args.rounds)
    print(f"world x{args.sessions} sessions, {args.steps} steps, K={args.every}")
    print(f"  step without checkpoints  {m['step_ms']:8.3f} ms")
    added = f"({m['step_added_pct']:+.1f}% of a step)"
    print(f"  step with checkpoints     {m['step_with_ms']:8.3f} ms  {added}")
    print(f"  one checkpoint            {m['one_ms']:8.3f} ms")
    share = f"({m['share_pct']:.1f}% of a step)"
    print(f"  checkpoints per step      {m['per_step_ms']:8.3f} ms  {share}")
    slot = f"(slot {m['slot_bytes']:,} bytes: twice a state)"
    print(f"  written per run           {m['written']}  {slot}")
    print(f"  one session's state       {m['state_bytes']:,} bytes")


if __name__ == "__main__":
    main()
