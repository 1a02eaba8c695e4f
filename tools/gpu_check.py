"""Every GPU check in one run, printed as JSON (for a machine with CUDA).

    python -m tools.gpu_check [--out results.json]

1. the GPU tests (``pytest -m gpu``);
2. the torch world model's step time with DEFERRED/HOT overlap (pipelined)
   against HOT and DEFERRED run alone, as ``overlap_ratio`` = pipelined step /
   (HOT + DEFERRED); below 1 means the streams really overlap;
3. device-to-slab copy bandwidth into the pinned slab against a pageable array;
4. chunks/s of the torch model at 1, 8 and 64 sessions.

Without CUDA it says so in the JSON and exits 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np


def _timed(fn: Any, repeat: int, sync: Any) -> float:
    """Median seconds of ``fn()`` with the device synchronized around it."""
    times = []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def gpu_tests() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return {"returncode": done.returncode, "summary": done.stdout.strip().splitlines()[-1:]}


def overlap(torch: Any, sessions: int = 64, repeat: int = 30) -> dict[str, float]:
    from rte import ComposedEngine  # noqa: PLC0415
    from rte.models.world import TorchWorldModel  # noqa: PLC0415

    model = TorchWorldModel(sessions, device="cuda")
    engine = ComposedEngine(model)
    names = [f"s{i}" for i in range(sessions)]
    for name in names:
        engine.attach(name)
    for _ in range(5):
        engine.step(names)
    sync = torch.cuda.synchronize
    piped = _timed(lambda: engine.step(names), repeat, sync)
    hot_batch = engine._batch([engine._by_session[n] for n in names], [{} for _ in names])

    def hot() -> None:
        for stage in engine._hot:
            engine.lanes.run(stage.lane, stage.fn, hot_batch)

    hot_alone = _timed(hot, repeat, sync)
    hot_batch.out = [np.empty(model.manifest().latent_shape, np.uint8) for _ in names]

    def deferred() -> None:
        for stage in engine._deferred:
            engine.lanes.run(stage.lane, stage.fn, hot_batch)

    deferred_alone = _timed(deferred, repeat, sync)
    engine.close()
    return {
        "sessions": sessions,
        "pipelined_step_ms": piped * 1e3,
        "hot_alone_ms": hot_alone * 1e3,
        "deferred_alone_ms": deferred_alone * 1e3,
        "overlap_ratio": piped / (hot_alone + deferred_alone),
    }


def copy_bandwidth(torch: Any, nbytes: int = 64 << 20, repeat: int = 20) -> dict[str, float]:
    from shm import Segment, Slab, shm_name  # noqa: PLC0415
    from shm.segment import HEADER_SIZE  # noqa: PLC0415

    name = shm_name(f"gpucheck{uuid.uuid4().hex[:8]}", "slab")
    segment = Segment.create(name, HEADER_SIZE + Slab.footprint(HEADER_SIZE, 1, nbytes, 1))
    try:
        slab = Slab.create(segment, HEADER_SIZE, slots=1, slot_bytes=nbytes, max_owners=1)
        pinned = slab.pin()
        with slab.loan(0, np.uint8, (nbytes,)) as loan:  # never published: aborted on leaving
            target = torch.from_numpy(loan.array)
            pageable = torch.from_numpy(np.empty(nbytes, np.uint8))
            source = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            sync = torch.cuda.synchronize
            slab_s = _timed(lambda: target.copy_(source, non_blocking=True), repeat, sync)
            page_s = _timed(lambda: pageable.copy_(source, non_blocking=True), repeat, sync)
        slab.unpin()
        return {
            "bytes": nbytes,
            "slab_pinned": pinned,
            "pinned_slab_gb_s": nbytes / slab_s / 1e9,
            "pageable_gb_s": nbytes / page_s / 1e9,
            "pinned_x_pageable": page_s / slab_s,
        }
    finally:
        segment.close()
        segment.unlink()


def chunk_rates(
    torch: Any, sizes: tuple[int, ...] = (1, 8, 64), seconds: float = 3.0
) -> list[dict[str, float]]:
    from rte import ComposedEngine  # noqa: PLC0415
    from rte.models.world import TorchWorldModel  # noqa: PLC0415

    rows = []
    for n in sizes:
        engine = ComposedEngine(TorchWorldModel(n, device="cuda"))
        names = [f"s{i}" for i in range(n)]
        for name in names:
            engine.attach(name)
        for _ in range(5):
            engine.step(names)
        chunks, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            chunks += sum(r.has_chunk for r in engine.step(names))
        elapsed = time.perf_counter() - t0
        engine.close()
        rows.append({"sessions": n, "chunks_per_s": chunks / elapsed})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    torch: Any
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        result: dict[str, Any] = {"cuda": False, "reason": "torch with CUDA is not available"}
    else:
        result = {
            "cuda": True,
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "gpu_tests": gpu_tests(),
            "overlap": overlap(torch),
            "copy_bandwidth": copy_bandwidth(torch),
            "chunks_per_s": chunk_rates(torch),
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
