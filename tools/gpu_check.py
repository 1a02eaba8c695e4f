"""Every GPU check in one run, as JSON: the acceptance test of the GPU path.

    python -m tools.gpu_check --isolate --budget 520 --out gpu.json   # what tools/gpu_run.sh runs

The sections, in order of value (:data:`ORDER`), each with a threshold from the
GPU goals (:mod:`tools.gpu_verdicts`, where the verdicts are drawn):

1. ``pinned_copy``: a slab view is ``is_pinned()``, a device-to-slab copy
   returns before it completes, and its bandwidth is >= 80% of a
   ``cudaHostAlloc`` buffer's, at a step's size and at a large one;
2. ``daemon``: ``rte serve --model torch --device cuda:0``, two clients with a
   session each, moving: the slab pinned, frames identical to the same model
   in process on the GPU, within 2 levels of the CPU;
3. ``sync_free``: 20 steady steps under ``set_sync_debug_mode("error")`` with
   graphs: heap outputs, the slab's layout with two clients in one batch, an
   encode in flight, attach/detach; the graphs replayed, and every profiled
   device-to-host copy Device -> Pinned;
4. ``solo_vs_batched``: three moving sessions alone and in a batch of 8: 0 levels;
5. ``stretched``: each lane slowed by ``torch.cuda._sleep``: frames identical;
6. ``encode``: ENCODE on the streams: a prompt changed mid-run (the row sits
   out and rejoins with it) and an encode that fails (that session FAILED):
   the bystanders' frames equal to 0 levels, no chunk of theirs lost;
7. ``overlap``: at 8 and 64 sessions, graphs on, a step <= 1.1 x max(HOT
   alone, DEFERRED alone) (each alone: the same engine with the other lane's
   work removed); the profiler's per-stream overlap as a figure;
8. ``rates``: step p50/p99, the host's share (t_host, the engine's own figure)
   and chunks/s at 1, 8, 64 sessions, graphs off and on, and graphs on with
   fenced publishing (t_host off the critical path); a graph that failed, or a
   t_host the engine did not keep, fails it;
9. ``world``: the learned world in torch on CUDA within 1 level of NumPy's, and
   the larger (untrained) configuration's step times;
10. ``suite``: the gpu-marked tests, then the rest, bounded by what is left.

``--isolate`` runs each section in a process of its own with its own timeout
(:data:`TIMEOUT_S`, and never past ``--budget``), so a hang or a sticky CUDA
error costs one section; ``--out`` is rewritten after each. Without CUDA it
prints ``{"cuda": false}`` and exits 0. ``--simulate`` runs the sections on the
CPU with the simulated CUDA lanes (what the tests do); those that need a GPU
say so instead. ``--summary FILE`` prints a short table of a run's results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SHM = "/dev/shm"
ORDER = [
    *("pinned_copy", "daemon", "sync_free", "solo_vs_batched", "stretched", "encode"),
    *("overlap", "rates", "world", "suite"),
]
TIMEOUT_S = {
    **{"pinned_copy": 45, "daemon": 100, "sync_free": 75, "solo_vs_batched": 60},
    **{"stretched": 60, "encode": 60, "overlap": 60, "rates": 60, "world": 60, "suite": 300},
}
LEAST_SUITE_S = 30  # the suite starts only with this much budget left


class Check:
    """Where the sections run: a CUDA device, or the CPU on simulated lanes."""

    def __init__(self, torch: Any, *, simulate: bool, budget_s: float = 300.0) -> None:
        self.torch = torch
        self.simulate = simulate
        self.device = "cpu" if simulate else "cuda:0"
        self.lanes = "sim" if simulate else "auto"
        self.cuda = not simulate
        self.budget_s = budget_s  # what the section may take (the suite reads it)

    def engine(
        self, sessions: int, *, graphs: bool | None = None, model: Any = None, publish: str = "wait"
    ) -> Any:
        """An engine over the world model (or ``model``) with ``sessions`` attached,
        warmed up (its model is ``engine.model``; ``publish`` its publishing)."""
        from rte import ComposedEngine  # noqa: PLC0415
        from rte.models.world import TorchWorldModel  # noqa: PLC0415

        model = model or TorchWorldModel(sessions, device=self.device, graphs=graphs)
        engine = ComposedEngine(model, lanes=self.lanes, publish=publish)  # pinned outputs
        engine.model = model  # type: ignore[attr-defined]
        for i in range(sessions):
            engine.attach(f"s{i}", {"prompt": f"world {i}"})
        for _ in range(10):
            engine.step(sessions_of(engine))
        return engine

    @contextlib.contextmanager
    def slab_engine(self, sessions: int, *, slab: bool) -> Iterator[Any]:
        """An engine whose outputs are slots of a pinned slab (``slab``), its sessions
        alternating between two owners, with slots wider than a frame (the padded
        copy): the daemon's layout, in process; else the engine's own outputs."""
        from rte import ComposedEngine  # noqa: PLC0415
        from rte.ipc.allocator import SlabAllocator  # noqa: PLC0415
        from rte.models.world import TorchWorldModel  # noqa: PLC0415
        from shm import Segment, Slab, shm_name  # noqa: PLC0415
        from shm.segment import HEADER_SIZE  # noqa: PLC0415

        model = TorchWorldModel(sessions, device=self.device)
        if not slab:
            engine = self.engine(sessions, model=model)
            try:
                yield engine
            finally:
                engine.close()
            return
        frame = int(np.prod(model.frame_shape))
        slots, owners = 8 * sessions, 2
        size = HEADER_SIZE + Slab.footprint(HEADER_SIZE, slots, frame + 256, owners)
        segment = Segment.create(shm_name(f"gpucheck{uuid.uuid4().hex[:8]}", "slab"), size)
        try:
            store = Slab.create(
                segment, HEADER_SIZE, slots=slots, slot_bytes=frame + 256, max_owners=owners
            )
            store.pin()
            owner: list[Any] = [_Owner(0), _Owner(1)]  # clients as the allocator sees them
            allocator = SlabAllocator(store, model.manifest(), lambda s: owner[int(s[1:]) % 2])
            engine = ComposedEngine(model, lanes=self.lanes, allocator=allocator)
            engine.model = model  # type: ignore[attr-defined]
            try:
                for i in range(sessions):
                    engine.attach(f"s{i}", {"prompt": f"world {i}"})
                for _ in range(10):
                    engine.step(sessions_of(engine))
                    _give_back(allocator)
                yield _Releasing(engine, allocator)
            finally:
                engine.close()
                _give_back(allocator)
                store.unpin()
        finally:
            segment.close()
            segment.unlink()

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


class _Owner:
    """A client as the allocator sees one: its slot owner index."""

    def __init__(self, index: int) -> None:
        self.index = index


def _give_back(allocator: Any) -> None:
    """Give back the slots a step leased (their copies are complete: the step
    published), as a daemon's clients release what they read."""
    for lease in allocator.take():
        lease.loan.abort()


class _Releasing:
    """An engine whose every step gives its slab leases back (as clients would)."""

    def __init__(self, engine: Any, allocator: Any) -> None:
        self._engine, self._allocator = engine, allocator
        self.model = engine.model

    def step(self, *args: Any) -> Any:
        out = self._engine.step(*args)
        _give_back(self._allocator)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def run_engine(
    check: Check,
    device: str,
    sessions: dict[str, dict[str, Any]],
    *,
    steps: int,
    max_sessions: int = 8,
    lanes: str | None = None,
    change_at: int | None = None,
    stretch: dict[Any, int] | None = None,
) -> dict[tuple[str, int], np.ndarray[Any, Any]]:
    """The frames of ``sessions`` (name -> conditioning at attach) over ``steps``
    steps of a fresh engine on ``device``; at ``change_at`` the first changes its
    prompt (an encode); ``stretch``: cycles each lane sleeps before each stage."""
    from rte import Action, ComposedEngine  # noqa: PLC0415
    from rte.models.world import TorchWorldModel  # noqa: PLC0415

    model = TorchWorldModel(max_sessions, device=device)
    engine = ComposedEngine(model, lanes=lanes or check.lanes)
    if stretch:
        engine.lanes.backend.stretch = stretch  # type: ignore[attr-defined]
    names = list(sessions)
    for name, conditioning in sessions.items():
        engine.attach(name, conditioning)
    out: dict[tuple[str, int], np.ndarray[Any, Any]] = {}
    for i in range(steps):
        actions = {names[0]: Action({"prompt": "changed"})} if i == change_at else {}
        out.update(frames(engine.step(names, actions)))
    out.update(frames(engine.finalize()))
    engine.close()
    return out


def sessions_of(engine: Any) -> list[str]:
    return list(engine.sessions())


def frames(results: Sequence[Any]) -> dict[tuple[str, int], np.ndarray[Any, Any]]:
    """Each chunk's frame by (session, chunk), copied (results may be reused views)."""
    return {(r.session, r.chunk): np.array(r.latent) for r in results if r.has_chunk}


def worst_difference(a: dict[Any, Any], b: dict[Any, Any]) -> tuple[int, int]:
    """The largest level difference over the frames both have, and how many they share."""
    shared = sorted(set(a) & set(b))
    worst = max((int(np.abs(a[k].astype(int) - b[k].astype(int)).max()) for k in shared), default=0)
    return worst, len(shared)


def shm_budget(path: str = SHM, most: int = 256 << 20, least: int = 8 << 20) -> int:
    """Bytes a test segment may take in ``path``: a quarter of what is free, within
    [least, most], a multiple of 1 MiB."""
    stats = os.statvfs(path)
    free = stats.f_bavail * stats.f_frsize
    return max(least, min(most, free // 4)) // (1 << 20) * (1 << 20)


def _section(module: str, name: str) -> Callable[[Check], dict[str, Any]]:
    def section(check: Check) -> dict[str, Any]:
        import importlib  # noqa: PLC0415 (the sections import this module)

        measure: Callable[[Check], dict[str, Any]] = getattr(importlib.import_module(module), name)
        return measure(check)

    section.__name__ = name
    return section


_TIMING = {"overlap", "rates", "world", "suite"}
SECTIONS: dict[str, Callable[[Check], dict[str, Any]]] = {
    name: _section("tools.gpu_timing" if name in _TIMING else "tools.gpu_sections", name)
    for name in ORDER
}


def _header(check: Check) -> dict[str, Any]:
    torch = check.torch
    return {
        "cuda": check.cuda,
        "simulated": check.simulate,
        "device": torch.cuda.get_device_name(0) if check.cuda else "cpu (simulated lanes)",
        "torch": torch.__version__,
        "sections": {},
    }


def _record(result: dict[str, Any], name: str, report: dict[str, Any], out: Path | None) -> None:
    result["sections"][name] = report
    result["failed"] = [n for n, r in result["sections"].items() if not r.get("ok")]
    if out is not None:
        out.write_text(json.dumps(result, indent=2))


def run_sections(check: Check, names: list[str], out: Path | None) -> dict[str, Any]:
    """Every section in this process, each reported even when another failed; ``out``
    kept current."""
    result = _header(check)
    for name in names:
        t0 = time.perf_counter()
        try:
            report = SECTIONS[name](check)
        except Exception as exc:  # one failing section never loses the others
            report = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        report["seconds"] = round(time.perf_counter() - t0, 2)
        _record(result, name, report, out)
    return result


def run_isolated(
    check: Check, names: list[str], out: Path | None, budget_s: float, log: Path | None
) -> dict[str, Any]:
    """Each section in a process of its own, bounded by its :data:`TIMEOUT_S` and
    by what is left of ``budget_s``; a section that cannot start in time is
    reported as not run (and fails)."""
    result = _header(check)
    end = time.monotonic() + budget_s
    for name in names:
        left = end - time.monotonic()
        limit = min(TIMEOUT_S[name], left) if name != "suite" else left
        if limit < (LEAST_SUITE_S if name == "suite" else 5):
            _record(result, name, {"ok": False, "error": f"not run: {left:.0f} s left"}, out)
            continue
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            part = Path(folder) / "section.json"
            command = [sys.executable, "-m", "tools.gpu_check", "--only", name, "--out", str(part)]
            command += [
                "--budget",
                str(int(limit) - 5),
                *(["--simulate"] if check.simulate else []),
            ]
            sink = log.open("a") if log is not None else subprocess.DEVNULL
            try:
                done = subprocess.run(command, stdout=sink, stderr=sink, timeout=limit, check=False)
                code: int | str = done.returncode
            except subprocess.TimeoutExpired:
                code = f"timed out after {limit:.0f} s"
            finally:
                if log is not None and not isinstance(sink, int):
                    sink.close()
            try:
                report = json.loads(part.read_text())["sections"][name]
            except (OSError, ValueError, KeyError):
                report = {"ok": False, "error": f"the section's process ended ({code}), no report"}
        report["seconds"] = round(time.perf_counter() - t0, 2)
        _record(result, name, report, out)
    return result


def summary(result: dict[str, Any]) -> str:
    """A short table of a run: each section's verdict, time, and what it missed."""
    lines = [f"device {result.get('device')}  torch {result.get('torch')}"]
    for name, report in result.get("sections", {}).items():
        verdict = "skip" if report.get("skipped") else "ok" if report.get("ok") else "FAIL"
        lines.append(f"{name:16} {verdict:4} {report.get('seconds', 0):7.1f} s")
        for why in [*report.get("failed", []), *([report["error"]] if "error" in report else [])]:
            lines.append(f"    - {str(why)[:200]}")
    lines.append(f"failed: {result.get('failed', [])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the JSON here (after each section)")
    parser.add_argument("--simulate", action="store_true", help="on the CPU, simulated lanes")
    parser.add_argument("--only", nargs="+", choices=ORDER, help="these sections")
    parser.add_argument("--isolate", action="store_true", help="each section in its own process")
    parser.add_argument("--budget", type=float, default=520.0, help="seconds for all sections")
    parser.add_argument("--log", type=Path, help="the sections' output (with --isolate)")
    parser.add_argument("--summary", type=Path, help="print the table of a run's JSON, and exit")
    args = parser.parse_args(argv)
    if args.summary is not None:
        print(summary(json.loads(args.summary.read_text())))
        return 0
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
    check = Check(torch, simulate=args.simulate, budget_s=args.budget)
    names = args.only or ORDER
    if args.isolate:
        result = run_isolated(check, names, args.out, args.budget, args.log)
    else:
        result = run_sections(check, names, args.out)
    print(summary(result) if args.isolate else json.dumps(result, indent=2))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
