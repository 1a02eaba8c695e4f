"""tools/gpu_check's timed sections: overlap, rates, the learned world, the suite.

Times are wall-clock over many steps with no synchronization between them
(the pipelined period a serve loop sees), after a warm-up; the verdicts are in
:mod:`tools.gpu_verdicts`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tools import gpu_trace
from tools import gpu_verdicts as verdict
from tools.gpu_check import Check, frames, sessions_of, worst_difference

STEPS = 60  # steps timed per figure


def _period_ms(engine: Any, steps: int = STEPS) -> float:
    """The mean step period over ``steps`` back-to-back steps (one sync at the end)."""
    names = sessions_of(engine)
    for _ in range(5):
        engine.step(names)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step(names)
    engine.lanes.drain()
    return (time.perf_counter() - t0) / steps * 1e3


def _lane_alone(lane: str) -> type:
    """The world model with only ``lane``'s work: HOT alone decodes nothing; DEFERRED
    alone decodes a latent HOT did not compute (one made at load)."""
    from rte.models.world import TorchWorldModel  # noqa: PLC0415

    class HotAlone(TorchWorldModel):
        def _decode(self, batch: Any) -> None:
            return None

    class DeferredAlone(TorchWorldModel):
        def _denoise(self, batch: Any) -> None:
            if not hasattr(self, "_still"):
                self._still = self.noise[: self.max_sessions].clone()
            batch.carry["latent"] = self._still[: len(batch.rows)]

        def _finalize(self, batch: Any) -> None:
            return None

    return HotAlone if lane == "hot" else DeferredAlone


def overlap(check: Check) -> dict[str, Any]:
    if not check.cuda:
        return {"ok": True, "skipped": "needs CUDA kernels"}
    from rte.models.world import TorchWorldModel  # noqa: PLC0415

    torch, rows = check.torch, []
    for n in (8, 64):
        row: dict[str, Any] = {"sessions": n}
        for key, kind in (("hot_alone_ms", "hot"), ("deferred_alone_ms", "deferred")):
            engine = check.engine(n, model=_lane_alone(kind)(n, device=check.device))
            row[key] = _period_ms(engine)
            engine.close()
        engine = check.engine(n, model=TorchWorldModel(n, device=check.device))
        model = engine.model
        row["step_ms"] = _period_ms(engine)
        row["graphs"] = model.graphs and model.hot_graphs.failed is None
        row["graph_failure"] = model.hot_graphs.failed or model.decode_graphs.failed
        with tempfile.TemporaryDirectory() as folder:
            trace = Path(folder) / "trace.json"
            activities = [torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                for _ in range(20):
                    engine.step(sessions_of(engine))
                torch.cuda.synchronize()
            prof.export_chrome_trace(str(trace))
            streams = gpu_trace.load(trace)
        engine.close()
        busiest = sorted(streams, key=lambda s: gpu_trace.busy(streams[s]), reverse=True)[:2]
        both = gpu_trace.overlap(*(streams[s] for s in busiest)) if len(busiest) == 2 else 0.0
        row["overlap_us"] = both
        row["busy_us_by_stream"] = {str(s): gpu_trace.busy(v) for s, v in streams.items()}
        rows.append(row)
    return verdict.overlap({"rows": rows})


def rates(check: Check, seconds: float = 1.5) -> dict[str, Any]:
    if check.simulate:  # on the CPU the rates say nothing of a GPU: a few steps a row
        seconds = min(seconds, 0.2)
    rows = []
    for graphs, publish in ((False, "wait"), (True, "wait"), (True, "fenced")):
        for n in (1, 8, 64):
            engine = check.engine(n, graphs=graphs, publish=publish)
            names, steps, chunks = sessions_of(engine), [], 0
            share0 = engine.host_share()
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                s0 = time.perf_counter()
                chunks += sum(r.has_chunk for r in engine.step(names))
                steps.append(time.perf_counter() - s0)
            elapsed = time.perf_counter() - t0
            share = engine.host_share()
            model = engine.model
            engine.close()
            timed = share.steps - share0.steps
            rows.append(
                {
                    "sessions": n,
                    "asked_graphs": graphs and check.cuda,
                    "publish": publish,
                    "graphs": bool(model.graphs) and model.hot_graphs.failed is None,
                    "graph_failure": model.hot_graphs.failed or model.decode_graphs.failed,
                    "step_p50_ms": float(np.percentile(steps, 50)) * 1e3,
                    "step_p99_ms": float(np.percentile(steps, 99)) * 1e3,
                    # t_host: the engine's figure, from a publish to the next HOT launch
                    "t_host_ms": (share.total_ns - share0.total_ns) / max(timed, 1) / 1e6,
                    "t_host_steps": timed,
                    "chunks_per_s": chunks / elapsed,
                }
            )
    return verdict.rates({"rows": rows})


def world(check: Check) -> dict[str, Any]:
    """The learned world in torch against the NumPy one (same weights, same sessions);
    then the larger configuration's step period at 8 and 64 sessions."""
    from rte import Action, ComposedEngine  # noqa: PLC0415
    from rte.models.learned import LearnedWorldModel  # noqa: PLC0415
    from rte.models.learned_torch import TorchLearnedWorld  # noqa: PLC0415

    def run(model: Any, lanes: str) -> dict[tuple[str, int], np.ndarray[Any, Any]]:
        engine = ComposedEngine(model, lanes=lanes)
        names = [f"w{i}" for i in range(4)]
        for name in names:
            engine.attach(name, {"prompt": f"a {name} world of snow and rain"})
        out: dict[tuple[str, int], np.ndarray[Any, Any]] = {}
        for i in range(8):
            actions = {s: Action({"move": (i % 3 - 1, 1)}) for s in names}
            out.update(frames(engine.step(names, actions)))
        engine.close()
        return out

    torched = TorchLearnedWorld(8, device=check.device)
    worst, shared = worst_difference(run(torched, check.lanes), run(LearnedWorldModel(8), "cpu"))
    measured: dict[str, Any] = {
        "worst": worst,
        "frames": shared,
        "graphs": (torched.graphs and torched.hot_graphs.failed is None) or check.simulate,
        "graph_failure": torched.hot_graphs.failed,
        "large": {},
    }
    if check.cuda:
        for n in (8, 64):
            big = TorchLearnedWorld(n, device=check.device, weights="large")
            engine = check.engine(n, model=big)
            measured["large"][str(n)] = {
                "config": big.describe(),
                "step_ms": _period_ms(engine, 30),
                "note": "untrained (random weights): a capacity figure, not a world",
            }
            engine.close()
    return verdict.world(measured)


_SUMMARY = re.compile(r"\d+ (passed|failed|error)")


def _pytest(args: list[str], timeout: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        output, code, cut = done.stdout, done.returncode, False
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or b""
        output = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        code, cut = -1, True
    lines = output.strip().splitlines()
    return {
        "returncode": code,
        "cut": cut,
        "summary": next((line for line in reversed(lines) if _SUMMARY.search(line)), lines[-1:]),
        "failed": [line for line in lines if line.startswith(("FAILED", "ERROR"))][:20],
    }


def suite(check: Check) -> dict[str, Any]:
    """The gpu-marked tests first, then the rest with what is left (bounded)."""
    end = time.monotonic() + check.budget_s
    if check.simulate:
        return verdict.suite({"gpu": _pytest(["tests/test_wire.py"], 120), "rest": None})
    gpu = _pytest(["-m", "gpu", "--timeout", "120"], max(10.0, end - time.monotonic()))
    left = end - time.monotonic()
    rest = _pytest(["-m", "not gpu and not soak", "--timeout", "60"], left) if left > 20 else None
    return verdict.suite({"gpu": gpu, "rest": rest})
