"""What tools/gpu_check measures, section by section; the verdicts are in tools/gpu_verdicts.

Every section returns ``gpu_verdicts.<section>(measured)``. On the simulated
lanes (``--simulate``) the sections that need kernels, pinned memory or the
profiler say so (``skipped``) and pass; the frame comparisons run on the CPU.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from tools import gpu_verdicts as verdict
from tools.gpu_check import Check, run_engine, shm_budget, worst_difference

STRETCH_CYCLES = 4_000_000  # about 2 ms at an H200's clock: far longer than any stage


def pinned_copy(check: Check) -> dict[str, Any]:
    from shm import Segment, Slab, shm_name  # noqa: PLC0415
    from shm.segment import HEADER_SIZE  # noqa: PLC0415

    torch, big = check.torch, shm_budget()
    if not check.cuda:
        return {"ok": True, "skipped": "needs CUDA", "bytes": big}
    name = shm_name(f"gpucheck{uuid.uuid4().hex[:8]}", "slab")
    step = 64 * 3072  # a step of 64 frames of 32x32x3
    segment = Segment.create(name, HEADER_SIZE + Slab.footprint(HEADER_SIZE, 1, big, 1))
    measured: dict[str, Any] = {"sizes": {}}
    try:
        slab = Slab.create(segment, HEADER_SIZE, slots=1, slot_bytes=big, max_owners=1)
        measured["slab_pinned"] = slab.pin()
        try:
            with slab.loan(0, np.uint8, (big,)) as loan:  # never published: aborted
                target = torch.from_numpy(loan.array)
                source = torch.randint(0, 255, (big,), dtype=torch.uint8, device="cuda")
                torch.cuda.synchronize()
                target.copy_(source, non_blocking=True)
                done = torch.cuda.Event()
                done.record()
                measured["copy_returned_before_done"] = not done.query()
                done.synchronize()
                measured["view_is_pinned"] = bool(target.is_pinned())
                for size in (step, big):
                    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)  # cudaHostAlloc
                    measured["sizes"][str(size)] = {
                        "slab_gb_s": size / copy_s(torch, target[:size], source[:size]) / 1e9,
                        "host_alloc_gb_s": size / copy_s(torch, host, source[:size]) / 1e9,
                    }
        finally:
            slab.unpin()
    finally:
        segment.close()
        segment.unlink()
    return verdict.pinned_copy(measured)


def copy_s(torch: Any, target: Any, source: Any, repeat: int = 20) -> float:
    """The median time of one device-to-host copy, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeat):
        start.record()
        target.copy_(source, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return float(np.median(times))


def daemon(check: Check) -> dict[str, Any]:
    """Two clients of one daemon, a session each with a move, against the same
    sessions in process on the same device (0 levels) and on the CPU."""
    from rte.client import connect  # noqa: PLC0415
    from rte.launch import LaunchedDaemon, unique_name  # noqa: PLC0415

    sessions = {
        "a": {"prompt": "a lit world", "move": (1, 0)},
        "b": {"prompt": "a dark world", "move": (0, 1)},
    }
    options = ["--model", "torch", "--device", check.device, "--max-sessions", "4"]
    env = {**os.environ, "RTE_LANES": "sim"} if check.simulate else None
    daemon = LaunchedDaemon(unique_name("gpucheck"), options, env=env)
    served: dict[tuple[str, int], np.ndarray[Any, Any]] = {}
    try:
        with daemon.connect(timeout=120) as first, connect(daemon.name) as second:
            clients = {"a": first, "b": second}
            for session, client in clients.items():
                client.attach(session, sessions[session])
            deadline = time.monotonic() + 60
            while len(served) < 12 and time.monotonic() < deadline:
                for session, client in clients.items():
                    chunk = client.poll(timeout=5)
                    if chunk is not None:
                        with chunk:
                            served[(session, chunk.chunk)] = chunk.latent.copy()
    finally:
        daemon.stop(60)
        said = daemon.said()
    same = run_engine(check, check.device, sessions, steps=10, max_sessions=4)
    cpu = run_engine(check, "cpu", sessions, steps=10, max_sessions=4, lanes="cpu")
    worst, shared = worst_difference(served, same)
    cpu_worst, cpu_shared = worst_difference(served, cpu)
    measured = {
        "ready": next((line for line in said.splitlines() if " ready " in line), ""),
        "slab_pinned": "slab_pinned=True" in said or check.simulate,
        "clients": 2,
        "in_process": {"worst": worst, "frames": shared},
        "cpu": {"worst": cpu_worst, "frames": cpu_shared},
    }
    return verdict.daemon(measured)


def _copies(trace: Path) -> dict[str, int]:
    """Device-to-host copies in a chrome trace, by kind (the profiler's names)."""
    events = json.loads(trace.read_text()).get("traceEvents", [])
    return dict(Counter(e["name"] for e in events if "Memcpy DtoH" in str(e.get("name", ""))))


def sync_free(check: Check) -> dict[str, Any]:
    """The steady state under ``set_sync_debug_mode("error")``, graphs on: heap
    outputs; the slab's layout with two clients' sessions in one batch; an encode
    in flight; an attach and a detach. Every device-to-host copy profiled."""
    if not check.cuda:
        return {"ok": True, "skipped": "needs CUDA"}
    from rte import Action  # noqa: PLC0415

    torch = check.torch
    scenarios: dict[str, Any] = {}

    def steady(engine: Any, names: list[str], i: int) -> None:
        engine.step(names)

    def encode(engine: Any, names: list[str], i: int) -> None:
        actions = {names[0]: Action({"prompt": f"changed {i}"})} if i % 4 == 0 else {}
        engine.step(names, actions)

    def churn(engine: Any, names: list[str], i: int) -> None:
        engine.step(names)
        if i % 5 == 4:
            engine.detach(names[-1])
            engine.attach(names[-1], {"prompt": "back"})

    for name, body, slab in (
        ("heap", steady, False),
        ("slab_two_clients", steady, True),
        ("encode_in_flight", encode, True),
        ("attach_detach", churn, True),
    ):
        with check.slab_engine(8, slab=slab) as engine:
            model, names = engine.model, list(engine.sessions())
            before, steps = model.hot_graphs.replays, 20
            scenario: dict[str, Any] = {"steps": steps, "error": None}
            with tempfile.TemporaryDirectory() as folder:
                trace = Path(folder) / "trace.json"
                activities = [torch.profiler.ProfilerActivity.CUDA]
                with torch.profiler.profile(activities=activities) as prof:
                    torch.cuda.set_sync_debug_mode("error")
                    try:
                        for i in range(steps):
                            body(engine, names, i)
                    except Exception as exc:
                        scenario["error"] = f"{type(exc).__name__}: {exc}"[:300]
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                    torch.cuda.synchronize()
                prof.export_chrome_trace(str(trace))
                scenario["copies"] = _copies(trace)
            scenario["graph_replays"] = model.hot_graphs.replays - before
            scenarios[name] = scenario
    return verdict.sync_free({"scenarios": scenarios})


def stretched(check: Check) -> dict[str, Any]:
    """Each lane slowed by ``torch.cuda._sleep`` before each of its stages: a wait
    the lanes lack shows as a frame that differs from the unstretched run's."""
    if not check.cuda:
        return {"ok": True, "skipped": "needs CUDA (torch.cuda._sleep)"}
    from rte.lanes import Lane  # noqa: PLC0415

    sessions = {f"s{i}": {"prompt": f"world {i}", "move": (i % 3 - 1, 1)} for i in range(4)}
    plain = run_engine(check, check.device, sessions, steps=12, change_at=3)
    runs = {}
    for lanes in ([Lane.HOT], [Lane.DEFERRED], [Lane.ENCODE], list(Lane)):
        stretch = {lane: STRETCH_CYCLES for lane in lanes}
        slow = run_engine(check, check.device, sessions, steps=12, change_at=3, stretch=stretch)
        worst, shared = worst_difference(plain, slow)
        runs["+".join(lane.value for lane in lanes)] = {"worst": worst, "frames": shared}
    return verdict.stretched({"runs": runs, "cycles": STRETCH_CYCLES})


def solo_vs_batched(check: Check) -> dict[str, Any]:
    """Three sessions with moves, each alone and in a batch of 8 (graphs on, on CUDA)."""
    batch = {f"s{i}": {"prompt": f"world {i}", "move": (i % 3 - 1, 1)} for i in range(8)}
    together = run_engine(check, check.device, batch, steps=8)
    worst, shared = 0, 0
    for name in ("s0", "s3", "s7"):
        alone = run_engine(check, check.device, {name: batch[name]}, steps=8)
        w, n = worst_difference(alone, together)
        worst, shared = max(worst, w), shared + n
    return verdict.compared(
        {"worst": worst, "frames": shared}, verdict.SAME_DEVICE_LEVELS, "solo vs batched"
    )


FAILING_PROMPT = "a prompt whose encode fails (gpu_check)"


def encode(check: Check) -> dict[str, Any]:
    """ENCODE on the check's streams: a prompt changed mid-run (the row sits out,
    rejoins with the new prompt, the bystanders' frames untouched), and an encode
    that fails (that session FAILED alone, the bystanders lose no chunk)."""
    from rte.models.world import TorchWorldModel  # noqa: PLC0415

    class FailingEncode(TorchWorldModel):
        def _encode_prompt(self, batch: Any) -> None:
            if any(c.get("prompt") == FAILING_PROMPT for c in batch.conditioning):
                raise RuntimeError("this prompt's encode fails (gpu_check's encode section)")
            super()._encode_prompt(batch)

    def run(change: str | None) -> tuple[dict[tuple[str, int], Any], dict[str, list[str]]]:
        from rte import Action, ComposedEngine  # noqa: PLC0415

        model = FailingEncode(8, device=check.device)
        engine = ComposedEngine(model, lanes=check.lanes)
        names = ["a", "b", "c"]
        for name in names:
            engine.attach(name, {"prompt": f"world {name}"})
        frames: dict[tuple[str, int], Any] = {}
        kinds: dict[str, list[str]] = {name: [] for name in names}
        try:
            for i in range(16):
                actions = {"b": Action({"prompt": change})} if change and i == 4 else {}
                for r in engine.step(list(names), actions):
                    kinds[r.session].append(r.kind.value)
                    if r.latent is not None:
                        frames[r.session, r.chunk] = r.latent.copy()
                    elif r.kind.value == "failed":
                        engine.detach(r.session)
                        names.remove(r.session)
        finally:
            engine.close()
        kinds["encoded"] = [prompt for _, prompt in model.encodes]
        return frames, kinds

    base, _ = run(None)
    changed, changed_kinds = run("a prompt changed mid-run")
    failed, failed_kinds = run(FAILING_PROMPT)

    def bystanders(frames: dict[tuple[str, int], Any]) -> dict[str, Any]:
        mine = {k: v for k, v in frames.items() if k[0] != "b"}
        ours = {k: v for k, v in base.items() if k[0] != "b"}
        worst, shared = worst_difference(mine, ours)
        return {"worst": worst, "shared": shared, "lost": len(set(ours) - set(mine))}

    after = [k for k in changed if k[0] == "b" and k[1] > 4]  # b's chunks made after it
    differs = any(
        not np.array_equal(changed[k], base[k]) for k in after if k in base and k in changed
    )
    measured = {
        "changed": {
            **bystanders(changed),
            "encoded": "a prompt changed mid-run" in changed_kinds["encoded"],
            "encoding_seen": "encoding" in changed_kinds["b"],  # a figure: it may be quick
            "chunks_after": len(after),
            "frames_changed": differs,
        },
        "failing": {**bystanders(failed), "session_failed": "failed" in failed_kinds["b"]},
    }
    return verdict.encode(measured)
