"""The thresholds of tools/gpu_check and the verdicts drawn from its measurements.

Each section of :mod:`tools.gpu_check` measures (on a GPU) and hands what it
measured to one function here, which returns the section's report: the
measurements, ``ok``, and ``failed``, a line per threshold missed. Kept apart
from the measuring, without torch, so that a test feeds each verdict a
measurement that misses its goal and sees the section fail
(``tests/test_gpu_check.py``). The thresholds are the GPU goals of issue 26.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

STEP_OVER_SLOWER_LANE = 1.1  # a pipelined step <= 1.1 x max(HOT alone, DEFERRED alone)
COPY_OF_HOST_ALLOC = 0.8  # a step's device-to-host copy >= 80% of a cudaHostAlloc buffer's
SAME_DEVICE_LEVELS = 0  # solo vs batched, daemon vs in process, stretched vs not
CPU_LEVELS = 2  # the torch model on CUDA against the same model on the CPU
WORLD_LEVELS = 1  # the learned world in torch against the NumPy one
LEAST_FRAMES = 5  # frames a comparison must share to mean anything
PINNED_COPY = "Memcpy DtoH (Device -> Pinned)"


def report(measured: dict[str, Any], failures: Iterable[str]) -> dict[str, Any]:
    """A section's report: what it measured, ``ok`` and the thresholds it missed."""
    failed = [f for f in failures if f]
    return {**measured, "ok": not failed, "failed": failed}


def frames_match(what: str, worst: int, shared: int, levels: int) -> list[str]:
    """Failures of a frame comparison: too few frames shared, or a difference too large."""
    out = []
    if shared < LEAST_FRAMES:
        out.append(f"{what}: {shared} frames compared, fewer than {LEAST_FRAMES}")
    if worst > levels:
        out.append(f"{what}: frames differ by {worst} levels, more than {levels}")
    return out


def pinned_copy(m: dict[str, Any]) -> dict[str, Any]:
    """``m``: slab_pinned, view_is_pinned, copy_returned_before_done, and per size
    (``sizes``: bytes -> {slab_gb_s, host_alloc_gb_s})."""
    failures = []
    if not m.get("slab_pinned"):
        failures.append("the slab was not page-locked")
    if not m.get("view_is_pinned"):
        failures.append("a slab view is not is_pinned(): copies into it are synchronous")
    if not m.get("copy_returned_before_done"):
        failures.append("the device-to-slab copy did not return before it completed")
    sizes = m.get("sizes") or {}
    if not sizes:
        failures.append("no copy was timed")
    for size, row in sizes.items():
        ratio = row["slab_gb_s"] / row["host_alloc_gb_s"] if row["host_alloc_gb_s"] else 0.0
        row["of_host_alloc"] = round(ratio, 3)
        if ratio < COPY_OF_HOST_ALLOC:
            failures.append(
                f"{size} B: the slab copy ran at {ratio:.0%} of a cudaHostAlloc buffer's "
                f"bandwidth, under {COPY_OF_HOST_ALLOC:.0%}"
            )
    return report(m, failures)


def overlap(m: dict[str, Any]) -> dict[str, Any]:
    """``m["rows"]``: per session count, graphs (used), graph_failure, step_ms,
    hot_alone_ms, deferred_alone_ms."""
    failures = []
    rows = m.get("rows") or []
    if not rows:
        failures.append("no step was timed")
    for row in rows:
        n = row["sessions"]
        if not row.get("graphs"):
            failures.append(f"{n} sessions: CUDA graphs did not run ({row.get('graph_failure')})")
        slower = max(row["hot_alone_ms"], row["deferred_alone_ms"])
        row["step_over_slower_lane"] = round(row["step_ms"] / slower, 3) if slower else None
        if not slower or row["step_ms"] > STEP_OVER_SLOWER_LANE * slower:
            failures.append(
                f"{n} sessions: a step takes {row['step_ms']:.3f} ms, over "
                f"{STEP_OVER_SLOWER_LANE} x max(HOT alone {row['hot_alone_ms']:.3f}, "
                f"DEFERRED alone {row['deferred_alone_ms']:.3f}) ms: the lanes do not overlap"
            )
    return report(m, failures)


def rates(m: dict[str, Any]) -> dict[str, Any]:
    """``m["rows"]``: per session count and graphs asked for: graphs (used),
    graph_failure, chunks_per_s, step_p50_ms, step_p99_ms, publish ("wait" or
    "fenced"), t_host_ms and t_host_steps (the engine's host share, and how many
    intervals it timed: none fails)."""
    failures = []
    rows = m.get("rows") or []
    if not rows:
        failures.append("no rate was measured")
    for row in rows:
        where = f"{row['sessions']} sessions, graphs {'on' if row['asked_graphs'] else 'off'}"
        where += ", fenced" if row.get("publish") == "fenced" else ""
        if row["asked_graphs"] and not row["graphs"]:
            failures.append(f"{where}: graphs did not run ({row.get('graph_failure')})")
        if row.get("graph_failure"):
            failures.append(f"{where}: a graph failed: {row['graph_failure']}")
        if not row["chunks_per_s"] > 0:
            failures.append(f"{where}: no chunk came out")
        if row.get("t_host_steps", 0) < 1:
            failures.append(f"{where}: the engine kept no t_host (host's share of a step)")
    return report(m, failures)


def sync_free(m: dict[str, Any]) -> dict[str, Any]:
    """``m["scenarios"]``: name -> {steps, error (a host sync torch refused, or
    None), graph_replays, copies (profiled device-to-host copies by kind)}."""
    failures = []
    scenarios = m.get("scenarios") or {}
    if not scenarios:
        failures.append("no scenario ran")
    for name, s in scenarios.items():
        if s.get("error"):
            failures.append(f"{name}: a host sync in the steady state: {s['error']}")
        if s.get("graphs_expected", True) and s.get("graph_replays", 0) < s.get("steps", 1):
            failures.append(
                f"{name}: {s.get('graph_replays', 0)} graph replays in {s.get('steps')} steps: "
                "the steps ran eagerly"
            )
        copies: dict[str, int] = s.get("copies") or {}
        other = {kind: count for kind, count in copies.items() if kind != PINNED_COPY}
        if other:
            failures.append(f"{name}: device-to-host copies not into pinned memory: {other}")
        if "copies" in s and not copies.get(PINNED_COPY):
            failures.append(f"{name}: no device-to-host copy was profiled")
    return report(m, failures)


def compared(m: dict[str, Any], levels: int, what: str) -> dict[str, Any]:
    """A frame comparison: ``m`` has worst and frames (shared)."""
    return report(m, frames_match(what, int(m.get("worst", 1 << 30)), int(m["frames"]), levels))


def stretched(m: dict[str, Any]) -> dict[str, Any]:
    """``m["runs"]``: lane(s) stretched -> {worst, frames} against the run unstretched."""
    failures = []
    runs = m.get("runs") or {}
    if not runs:
        failures.append("no stretched run")
    for name, run in runs.items():
        failures += frames_match(
            f"{name} stretched", run["worst"], run["frames"], SAME_DEVICE_LEVELS
        )
    return report(m, failures)


def daemon(m: dict[str, Any]) -> dict[str, Any]:
    """``m``: slab_pinned, frames and worst against the same model in process on the
    same device (``in_process``) and on the CPU (``cpu``), clients (how many)."""
    failures = [] if m.get("slab_pinned") else ["the daemon's slab was not page-locked"]
    if m.get("clients", 0) < 2:
        failures.append("fewer than two clients: a batch of several clients was not served")
    same = m["in_process"]
    failures += frames_match("daemon vs in process", same["worst"], same["frames"], 0)
    cpu = m["cpu"]
    failures += frames_match("daemon vs the CPU", cpu["worst"], cpu["frames"], CPU_LEVELS)
    return report(m, failures)


def world(m: dict[str, Any]) -> dict[str, Any]:
    """``m``: the learned world in torch on CUDA against NumPy (worst, frames), graphs
    (used), and the larger configuration's step times (figures, no threshold)."""
    failures = frames_match("torch world vs NumPy", m["worst"], m["frames"], WORLD_LEVELS)
    if not m.get("graphs"):
        failures.append(f"CUDA graphs did not run ({m.get('graph_failure')})")
    return report(m, failures)


def suite(m: dict[str, Any]) -> dict[str, Any]:
    """``m``: gpu (the gpu-marked tests' exit code and summary), rest (the other
    tests', with ``cut`` when the budget ended them)."""
    failures = []
    if m["gpu"]["returncode"] not in (0, 5):  # 5: none collected
        failures.append(f"gpu-marked tests failed: {m['gpu']['summary']}")
    rest = m.get("rest")
    if rest is not None and not rest.get("cut") and rest["returncode"] != 0:
        failures.append(f"the suite failed: {rest['summary']}")
    if rest is not None and rest.get("failed"):
        failures.append(f"failed before the budget ended the suite: {rest['failed'][:5]}")
    return report(m, failures)


def encode(m: dict[str, Any]) -> dict[str, Any]:
    """``m["changed"]``: a prompt changed mid-run: bystanders' ``worst`` (levels
    against the run without the change), ``shared`` and ``lost`` frames,
    ``encoded`` (the new prompt went through ENCODE), ``chunks_after`` the
    change, ``frames_changed``.
    ``m["failing"]``: an encode that fails: the bystanders' figures and
    ``session_failed``. Bystanders must match to 0 levels and lose nothing."""
    failures = []
    changed, failing = m.get("changed") or {}, m.get("failing") or {}
    for what, run in (("a prompt change", changed), ("a failing encode", failing)):
        if not run.get("shared"):
            failures.append(f"{what}: no bystander frame to compare")
        if run.get("worst", 1) != 0:
            failures.append(f"{what}: bystanders' frames differ by {run.get('worst')} levels")
        if run.get("lost", 1):
            failures.append(f"{what}: bystanders lost {run.get('lost')} chunks")
    if not changed.get("encoded"):
        failures.append("a prompt change: the new prompt never went through ENCODE")
    if changed.get("chunks_after", 0) < 3 or not changed.get("frames_changed"):
        failures.append("a prompt change: the session did not go on with its new prompt")
    if not failing.get("session_failed"):
        failures.append("a failing encode: its session was not FAILED")
    return report(m, failures)
