"""The cost of checkpoints per step (issue 25's target: at most 5% of a step at K = 30).

Runs the daemon's serve loop in this process with the ``world`` model (8
sessions, pipelined) flat out, with and without the checkpoint writer of
:mod:`rte.ipc.checkpoints` (every K steps of each session: suspend, resume,
to_bytes, the write into shared memory), rounds interleaved so the box's noise
falls on both alike; prints each one's mean step (a noisy difference on a busy
box), the time checkpoints themselves took spread over the steps and its share
of a step (the figure to read),
the bytes of one session's checkpoint, and the time of one checkpoint.

    python tools/bench_checkpoint.py [--every 30] [--sessions 8] [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from rte import Attach, ComposedEngine, ServeLoop
from rte.ipc.checkpoints import Checkpoints
from rte.models.learned import LearnedWorldModel
from rte.protocol.names import DaemonNames


def run(sessions: int, steps: int, every: int) -> tuple[float, float, int, int]:
    """Mean step seconds, mean seconds of one checkpoint, checkpoints written, bytes of one."""
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
        return elapsed / steps, spent / max(1, written), written, size
    finally:
        if writer is not None:
            writer.close()
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=30)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base, with_ckpt, each = [], [], []
    written = slot = 0
    for _ in range(args.rounds):
        base.append(run(args.sessions, args.steps, 0)[0])
        step, one, written, slot = run(args.sessions, args.steps, args.every)
        with_ckpt.append(step)
        each.append(one)
    b, c = statistics.median(base), statistics.median(with_ckpt)
    print(f"world x{args.sessions} sessions, {args.steps} steps, K={args.every}")
    print(f"  step without checkpoints  {b * 1e3:8.3f} ms")
    print(f"  step with checkpoints     {c * 1e3:8.3f} ms  ({(c - b) / b:+.1%} of a step)")
    one = statistics.median(each)
    per_step = one * written / args.steps  # the time checkpoints take, spread over the steps
    print(f"  one checkpoint            {one * 1e3:8.3f} ms")
    print(f"  checkpoints per step      {per_step * 1e3:8.3f} ms  ({per_step / b:.1%} of a step)")
    print(f"  written per run           {written}  (slot {slot:,} bytes: twice a state)")


if __name__ == "__main__":
    main()
