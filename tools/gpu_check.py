"""Every GPU check in one run, as JSON: the acceptance test of the GPU path.

    python -m tools.gpu_check --out gpu.json

Each section runs in turn, bounded in time, and reports even when another
failed (its error is its result); ``--out`` is rewritten after every section,
so a run cut short still leaves what it measured. The sections:

1. ``suite``: the whole test suite on this machine (not only ``-m gpu``);
2. ``daemon``: ``rte serve --model torch --device cuda:0`` serving a client in
   this (another) process: the slab pinned, frames within tolerance of the CPU;
3. ``pinned_copy``: a slab view is ``is_pinned()``, a device-to-slab copy
   returns before it completes, pinned against pageable bandwidth (sized to
   what ``/dev/shm`` has free: Docker gives it 64 MiB);
4. ``sync_free``: the steady-state step under ``set_sync_debug_mode("error")``;
5. ``overlap``: HOT/DEFERRED overlap from the profiler's kernel intervals per
   stream, and the pipelined step against HOT and DEFERRED alone;
6. ``rates``: step p50/p99 and chunks/s at 1, 8, 64 sessions, with and
   without CUDA graphs;
7. ``solo_vs_batched``: a session's frames solo and in a batch of 8, within
   ``TOLERANCE`` levels (cuBLAS is not bit-identical across batch sizes).

Without CUDA it prints ``{"cuda": false}`` and exits 0. ``--simulate`` runs
the same sections on the CPU with the simulated CUDA lanes (what the tests
do); the sections that need a GPU say so instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tools import gpu_trace

TOLERANCE = 2  # uint8 levels a frame may differ by between devices or batch sizes
SHM = "/dev/shm"


class Check:
    """Where the sections run: a CUDA device, or the CPU on simulated lanes."""

    def __init__(self, torch: Any, *, simulate: bool) -> None:
        self.torch = torch
        self.simulate = simulate
        self.device = "cpu" if simulate else "cuda:0"
        self.lanes = "sim" if simulate else "auto"
        self.cuda = not simulate

    def engine(self, sessions: int, *, graphs: bool | None = None) -> Any:
        """An engine over the world model with ``sessions`` attached, warmed up (its
        model is ``engine.model``)."""
        from rte import ComposedEngine  # noqa: PLC0415
        from rte.models.world import TorchWorldModel  # noqa: PLC0415

        model = TorchWorldModel(sessions, device=self.device, graphs=graphs)
        engine = ComposedEngine(model, lanes=self.lanes)  # on CUDA: pinned outputs
        engine.model = model  # type: ignore[attr-defined]
        for i in range(sessions):
            engine.attach(f"s{i}", {"prompt": f"world {i}"})
        for _ in range(10):
            engine.step(sessions_of(engine))
        return engine

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def sessions_of(engine: Any) -> list[str]:
    return list(engine.sessions())


def frames(results: list[Any]) -> dict[tuple[str, int], np.ndarray[Any, Any]]:
    return {(r.session, r.chunk): r.latent.copy() for r in results if r.has_chunk}


def worst_difference(a: dict[Any, Any], b: dict[Any, Any]) -> tuple[int, int]:
    """The largest level difference over the frames both have, and how many they share."""
    shared = sorted(set(a) & set(b))
    worst = max((int(np.abs(a[k].astype(int) - b[k].astype(int)).max()) for k in shared), default=0)
    return worst, len(shared)


# -- the sections ----------------------------------------------------------------


def suite(check: Check) -> dict[str, Any]:
    args = ["tests/test_wire.py"] if check.simulate else []
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return {"ok": done.returncode == 0, "summary": lines[-1:], "failed": failed[:20]}


def daemon(check: Check) -> dict[str, Any]:
    from rte.client import connect  # noqa: PLC0415
    from rte.ipc.childlog import child_log  # noqa: PLC0415
    from rte.ipc.childlog import said as read_log  # noqa: PLC0415
    from rte.models.world import TorchWorldModel  # noqa: PLC0415

    name = f"gpucheck{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "rte", "serve", "--name", name, "--model", "torch"]
    command += ["--device", check.device, "--max-sessions", "2"]
    env = {**os.environ, "RTE_LANES": "sim"} if check.simulate else None
    log = child_log()  # closed below
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=env)
    served: dict[tuple[str, int], np.ndarray[Any, Any]] = {}
    try:
        with connect(name, timeout=120) as client:
            client.attach("a", {"prompt": "a lit world"})
            deadline = time.monotonic() + 60
            while len(served) < 6 and time.monotonic() < deadline:
                chunk = client.poll(timeout=5)
                if chunk is not None:
                    with chunk:
                        served[("a", chunk.chunk)] = chunk.latent.copy()
    finally:
        process.terminate()
        process.wait(60)
        said = read_log(log)
        log.close()
    from rte import ComposedEngine  # noqa: PLC0415

    reference = ComposedEngine(TorchWorldModel(2, device="cpu"), lanes="cpu")
    reference.attach("a", {"prompt": "a lit world"})
    cpu: dict[tuple[str, int], np.ndarray[Any, Any]] = {}
    for _ in range(10):
        cpu.update(frames(reference.step(["a"])))
    reference.close()
    worst, shared = worst_difference(served, cpu)
    pinned = "slab_pinned=True" in said
    ready = next((line for line in said.splitlines() if " ready " in line), "")
    ok = shared >= 5 and worst <= TOLERANCE and (pinned or check.simulate)
    return {"ok": ok, "ready": ready, "slab_pinned": pinned, "frames": shared, "worst": worst}


def shm_budget(path: str = SHM, most: int = 256 << 20, least: int = 8 << 20) -> int:
    """Bytes a test segment may take in ``path``: a quarter of what is free, within
    [least, most], a multiple of 1 MiB."""
    stats = os.statvfs(path)
    free = stats.f_bavail * stats.f_frsize
    return max(least, min(most, free // 4)) // (1 << 20) * (1 << 20)


def pinned_copy(check: Check) -> dict[str, Any]:
    from shm import Segment, Slab, shm_name  # noqa: PLC0415
    from shm.segment import HEADER_SIZE  # noqa: PLC0415

    torch, nbytes = check.torch, shm_budget()
    if not check.cuda:
        return {"ok": True, "skipped": "needs CUDA", "bytes": nbytes}
    name = shm_name(f"gpucheck{uuid.uuid4().hex[:8]}", "slab")
    segment = Segment.create(name, HEADER_SIZE + Slab.footprint(HEADER_SIZE, 1, nbytes, 1))
    try:
        slab = Slab.create(segment, HEADER_SIZE, slots=1, slot_bytes=nbytes, max_owners=1)
        pinned = slab.pin()
        try:
            with slab.loan(0, np.uint8, (nbytes,)) as loan:  # never published: aborted
                target = torch.from_numpy(loan.array)
                source = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                target.copy_(source, non_blocking=True)
                returned_s = time.perf_counter() - t0
                done = torch.cuda.Event()
                done.record()
                pending = not done.query()
                done.synchronize()
                copy_s = time.perf_counter() - t0
                pageable = torch.from_numpy(np.empty(nbytes, np.uint8))
                slab_s = _timed(lambda: target.copy_(source, non_blocking=True), check)
                page_s = _timed(lambda: pageable.copy_(source, non_blocking=True), check)
                is_pinned = bool(target.is_pinned())
        finally:
            slab.unpin()
    finally:
        segment.close()
        segment.unlink()
    return {
        "ok": pinned and is_pinned and pending,
        "bytes": nbytes,
        "slab_pinned": pinned,
        "view_is_pinned": is_pinned,
        "copy_returned_before_done": pending,
        "call_us": returned_s * 1e6,
        "copy_us": copy_s * 1e6,
        "pinned_gb_s": nbytes / slab_s / 1e9,
        "pageable_gb_s": nbytes / page_s / 1e9,
    }


def _timed(fn: Callable[[], object], check: Check, repeat: int = 10) -> float:
    times = []
    for _ in range(repeat):
        check.sync()
        t0 = time.perf_counter()
        fn()
        check.sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def sync_free(check: Check) -> dict[str, Any]:
    if not check.cuda:
        return {"ok": True, "skipped": "needs CUDA"}
    out = {}
    for graphs in (False, True):
        engine = check.engine(8, graphs=graphs)
        names = sessions_of(engine)
        check.torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(20):
                engine.step(names)
        finally:
            check.torch.cuda.set_sync_debug_mode("default")
            engine.close()
        out["graphs" if graphs else "eager"] = "no host sync in 20 steps"
    return {"ok": True, **out}


def overlap(check: Check) -> dict[str, Any]:
    if not check.cuda:
        return {"ok": True, "skipped": "needs CUDA kernels"}
    torch = check.torch
    engine = check.engine(64, graphs=False)
    names = sessions_of(engine)
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(20):
                engine.step(names)
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(trace))
        streams = gpu_trace.load(trace)
    piped = _timed(lambda: engine.step(names), check, 20)
    engine.close()
    busiest = sorted(streams, key=lambda s: gpu_trace.busy(streams[s]), reverse=True)[:2]
    both = gpu_trace.overlap(*(streams[s] for s in busiest)) if len(busiest) == 2 else 0.0
    least = min((gpu_trace.busy(streams[s]) for s in busiest), default=0.0)
    return {
        "ok": len(busiest) == 2 and both > 0,
        "busy_us_by_stream": {str(s): gpu_trace.busy(v) for s, v in streams.items()},
        "overlap_us": both,
        "overlap_of_the_lesser": both / least if least else 0.0,
        "pipelined_step_ms": piped * 1e3,
    }


def rates(check: Check, seconds: float = 1.5) -> dict[str, Any]:
    rows = []
    for graphs in (False, True):
        for n in (1, 8, 64):
            engine = check.engine(n, graphs=graphs)
            names, steps, chunks = sessions_of(engine), [], 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                s0 = time.perf_counter()
                chunks += sum(r.has_chunk for r in engine.step(names))
                steps.append(time.perf_counter() - s0)
            elapsed = time.perf_counter() - t0
            model = engine.model
            used = bool(model.graphs) and model.hot_graphs.failed is None
            engine.close()
            rows.append(
                {
                    "sessions": n,
                    "graphs": used,
                    "graph_failure": model.hot_graphs.failed or model.decode_graphs.failed,
                    "step_p50_ms": float(np.percentile(steps, 50)) * 1e3,
                    "step_p99_ms": float(np.percentile(steps, 99)) * 1e3,
                    "chunks_per_s": chunks / elapsed,
                }
            )
    return {"ok": True, "rows": rows}


def solo_vs_batched(check: Check) -> dict[str, Any]:
    from rte import ComposedEngine  # noqa: PLC0415
    from rte.models.world import TorchWorldModel  # noqa: PLC0415

    def run(sessions: int) -> dict[tuple[str, int], np.ndarray[Any, Any]]:
        engine = ComposedEngine(TorchWorldModel(8, device=check.device), lanes=check.lanes)
        for i in range(sessions):
            engine.attach(f"s{i}", {"prompt": f"world {i}"})
        out: dict[tuple[str, int], np.ndarray[Any, Any]] = {}
        for _ in range(8):
            out.update(frames(engine.step([f"s{i}" for i in range(sessions)])))
        engine.close()
        return {k: v for k, v in out.items() if k[0] == "s0"}

    worst, shared = worst_difference(run(1), run(8))
    return {"ok": shared >= 6 and worst <= TOLERANCE, "frames": shared, "worst": worst}


SECTIONS: dict[str, Callable[[Check], dict[str, Any]]] = {
    "suite": suite,
    "daemon": daemon,
    "pinned_copy": pinned_copy,
    "sync_free": sync_free,
    "overlap": overlap,
    "rates": rates,
    "solo_vs_batched": solo_vs_batched,
}


def run_sections(check: Check, names: list[str], out: Path | None) -> dict[str, Any]:
    """Every section, each reported even when another failed; ``out`` kept current."""
    torch = check.torch
    result: dict[str, Any] = {
        "cuda": check.cuda,
        "simulated": check.simulate,
        "device": torch.cuda.get_device_name(0) if check.cuda else "cpu (simulated lanes)",
        "torch": torch.__version__,
        "sections": {},
    }
    for name in names:
        t0 = time.perf_counter()
        try:
            report = SECTIONS[name](check)
        except Exception as exc:  # one failing section never loses the others
            report = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        report["seconds"] = round(time.perf_counter() - t0, 2)
        result["sections"][name] = report
        result["failed"] = [n for n, r in result["sections"].items() if not r.get("ok")]
        if out is not None:
            out.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the JSON here (after each section)")
    parser.add_argument("--simulate", action="store_true", help="on the CPU, simulated lanes")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), help="these sections")
    args = parser.parse_args(argv)
    torch: Any
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        torch = None
    if torch is None or (not args.simulate and not torch.cuda.is_available()):
        result: dict[str, Any] = {"cuda": False, "reason": "torch with CUDA is not available"}
        if args.out:
            args.out.write_text(json.dumps(result))
        print(json.dumps(result))
        return 0
    check = Check(torch, simulate=args.simulate)
    result = run_sections(check, args.only or list(SECTIONS), args.out)
    print(json.dumps(result, indent=2))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
