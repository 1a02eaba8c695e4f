"""A session's world survives (issue 25): suspend, migrate, drain, checkpoint, replay, crash.

Every figure but the checkpoint's comes through real daemons (``rte serve``
children, :class:`rte.launch.LaunchedDaemon`) of the ``world`` model paced at
:data:`PACE_HZ`, and is given in periods of that pace, since on a shared box
absolute times drift and the pace is what a user feels. A stall is the largest
gap, by the daemons' emission stamps (``timing.emitted_ns``, one monotonic
clock for every process), between consecutive chunks of a session across the
event, in periods: 1.0 is no stall at all, a chunk every period as before.

* **suspend / resume**: :data:`BACKGROUND` other sessions streaming, session
  ``a`` is suspended and at once resumed, :attr:`Plan.cycles` times: the
  client's ``suspend`` and ``resume`` calls (each returns at its SUSPENDED /
  RESUMED notice) and the stall across the two.
* **migrate**: ``PoolClient.migrate`` of ``a`` back and forth between two
  daemons, :attr:`Plan.moves` times: the call and the stall.
* **drain**: a daemon holding :attr:`Plan.drain_sessions` sessions of two
  client processes (:mod:`tools.state_clients`), each ``PoolClient.drain`` of
  its own sessions at once: the time from the first start to the last end, and
  each session's stall. Then the same with ``rte drain NAME``, the clients
  only streaming and moving their sessions when the daemon says: the
  command's own time, and each stall.
* **checkpoint**: :func:`tools.bench_checkpoint.measure` (in process, flat out,
  the world model's 8 sessions): the time checkpoints take every K = 30 steps,
  as a share of a step, and the bytes of one session's state.
* **replay**: a session recorded through a daemon (:class:`rte.recorder.Recorder`,
  a move a chunk), made again flat out in process
  (:func:`rte.replay.replay_engine`, what ``rte replay TRACE`` runs): chunks/s and
  the multiple of real time.
* **crash**: a pool of two daemons run with ``--checkpoint-every 30``, the one
  streaming ``a`` SIGKILLed at a chunk that moves through the checkpoint cycle,
  ``recover=read_checkpoint``: the chunks made again (lost progress) per crash.

Each count (of chunk gaps and repeats, of sessions moved, replay identical)
is in the result too: the figures only mean something when those are right.

    python -m tools.bench_state [--json] [--quick]    # or rte bench --suite state
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rte.client import NoticeKind, connect_pool
from rte.composed import ComposedEngine
from rte.errors import RteError
from rte.ipc.checkpoints import read_checkpoint
from rte.launch import LaunchedDaemon, unique_name
from rte.models import load_model
from rte.recorder import Recorder
from rte.replay import replay_engine
from rte.trace import read_trace
from tools import bench_checkpoint, report
from tools.state_clients import DrainClients, Streams

PACE_HZ = 30.0
PERIOD_NS = 1e9 / PACE_HZ
EVERY = 30  # K: a session is checkpointed every K of its steps
BACKGROUND = 3  # sessions streaming beside the measured one
TIMEOUT_S = 10.0  # the most any one wait for a chunk lasts
MIGRATION_TARGET = 2.0  # periods
CHECKPOINT_TARGET = 5.0  # % of a step
# admission by rows: a loaded box may measure a real-time capacity below the drain's
# 32 sessions, and admission is not what this measures (bench_realtime does)
WORLD = ["--model", "world", "--pace-hz", str(PACE_HZ), "--admission", "rows"]
COLUMNS = ["figure", "p50", "p99", "unit", "target", "met"]
TABLES: list[report.TableSpec] = [
    (f"A session's world survives (world model at {PACE_HZ:g} Hz)", "rows", {}, COLUMNS)
]


@dataclass(frozen=True)
class Plan:
    """How much of each part runs."""

    cycles: int = 40  # suspend-resume cycles
    moves: int = 30  # migrations
    drain_sessions: int = 32  # on the drained daemon, half from each client
    checkpoint_steps: int = 300
    checkpoint_rounds: int = 3
    replay_chunks: int = 150
    crashes: int = 5


QUICK = Plan(cycles=4, moves=4, drain_sessions=8, checkpoint_steps=60, checkpoint_rounds=1,
             replay_chunks=20, crashes=1)  # fmt: skip


def percentiles(figure: str, values: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    """``<figure>_p50_<unit>`` and ``..._p99_<unit>`` of ``values`` times ``scale``
    (``figure`` is ``<figure>_<unit>``)."""
    what, unit = figure.rsplit("_", 1)
    a = np.asarray(values, dtype=np.float64) * scale
    return {f"{what}_p{q}_{unit}": float(np.percentile(a, q)) for q in (50, 99)}


def pair(result: dict[str, Any], figure: str) -> tuple[float, float]:
    """The p50 and p99 of ``<figure>_<unit>`` in ``result``."""
    what, unit = figure.rsplit("_", 1)
    return result[f"{what}_p50_{unit}"], result[f"{what}_p99_{unit}"]


def daemon_name() -> str:
    """A daemon name of this process's own (``bench-state-PID-XXXXXX``)."""
    return unique_name("bench-state")


@contextlib.contextmanager
def daemons(names: Sequence[str], options: Sequence[str]) -> Iterator[list[LaunchedDaemon]]:
    """Daemons of ``names`` started together, ready; stopped (leftovers removed) after."""
    with contextlib.ExitStack() as stack:
        started = [stack.enter_context(LaunchedDaemon(n, options)) for n in names]
        for d in started:
            d.wait_ready()
        yield started


def timed(call: Callable[[], object]) -> float:
    began = time.monotonic()
    call()
    return time.monotonic() - began


# -- the parts -------------------------------------------------------------------


def suspend_resume(plan: Plan) -> dict[str, Any]:
    """Session ``a`` suspended and resumed at once, :attr:`Plan.cycles` times."""
    suspends, resumes, stalls = [], [], []
    with (
        daemons([daemon_name()], [*WORLD, "--max-sessions", "8"]) as (daemon,),
        daemon.connect() as client,
    ):
        streams = Streams(client, PERIOD_NS)
        for i in range(BACKGROUND):
            client.attach(f"bg{i}", {"prompt": "a desert"})
        client.attach("a", {"prompt": "a forest"})
        streams.until("a", 3)
        for _ in range(plan.cycles):
            streams.until("a", streams.last("a") + 3)
            since = streams.last("a")
            suspends.append(timed(lambda: client.suspend("a")))
            resumes.append(timed(lambda: client.resume("a")))
            streams.until("a", streams.last("a") + 2)
            stalls.append(streams.stall("a", since))
    return {
        "cycles": plan.cycles,
        **percentiles("suspend_ms", suspends, 1e3),
        **percentiles("resume_ms", resumes, 1e3),
        **percentiles("suspend_periods", suspends, PACE_HZ),
        **percentiles("resume_periods", resumes, PACE_HZ),
        **percentiles("stall_periods", stalls),
        "gaps": streams.gaps(),
        "repeats": streams.repeats,
    }


def migrate(plan: Plan) -> dict[str, Any]:
    """Session ``a`` moved between two daemons and back, :attr:`Plan.moves` times."""
    calls, stalls = [], []
    with daemons([daemon_name(), daemon_name()], [*WORLD, "--max-sessions", "8"]) as two:
        client = connect_pool([d.name for d in two], timeout=30)
        with client:
            streams = Streams(client, PERIOD_NS)
            client.attach("a", {"prompt": "a forest"})
            client.attach("bg", {"prompt": "a desert"})
            streams.until("a", 3)
            for _ in range(plan.moves):
                streams.until("a", streams.last("a") + 3)
                since, old = streams.last("a"), client.home["a"]
                to = next(d.name for d in two if d.name != old)
                calls.append(timed(functools.partial(client.migrate, "a", to=to)))
                streams.until("a", streams.last("a") + 2)
                stalls.append(streams.stall("a", since))
                if client.home["a"] != to:
                    raise RteError(f"bench_state: 'a' is on {client.home['a']!r}, not {to!r}")
    return {
        "moves": plan.moves,
        **percentiles("call_ms", calls, 1e3),
        **percentiles("call_periods", calls, PACE_HZ),
        **percentiles("stall_periods", stalls),
        "gaps": streams.gaps(),
        "repeats": streams.repeats,
    }


def drain(plan: Plan, daemon_wide: bool = False) -> dict[str, Any]:
    """A daemon of :attr:`Plan.drain_sessions` sessions from two client processes,
    each draining its own at once (:mod:`tools.state_clients`), or with
    ``daemon_wide``, ``rte drain NAME`` moving them all (the clients follow)."""
    rows = ["--max-sessions", str(plan.drain_sessions)]
    spare, said = daemon_name(), [""]
    with contextlib.ExitStack() as stack:
        (full,) = stack.enter_context(daemons([daemon_name()], [*WORLD, *rows]))
        share = plan.drain_sessions // 2
        clients = DrainClients(full.name, spare, 2, share, PERIOD_NS, follows=daemon_wide)
        stack.callback(clients.close)
        clients.attached()  # every session streaming on the one daemon up
        stack.enter_context(daemons([spare], [*WORLD, *rows]))

        def rte_drain() -> None:
            said[0] = _rte_drain(full.name)

        reports = clients.drain(rte_drain if daemon_wide else lambda: None)
    stalls = [s for r in reports for s in r["stalls"]]
    seconds = max(r["ended"] for r in reports) - min(r["began"] for r in reports)
    if daemon_wide:  # its own figure: from its connect to the daemon empty
        seconds = float(said[0].rsplit(" left it in ", 1)[-1].split()[0])
    return {
        "sessions": plan.drain_sessions,
        "clients": len(reports),
        "how": "rte drain NAME" if daemon_wide else "PoolClient.drain by each client at once",
        "seconds": seconds,
        "periods": seconds * PACE_HZ,
        "per_session_ms": seconds / plan.drain_sessions * 1e3,
        **percentiles("stall_periods", stalls),
        "moved": sum(r["moved"] for r in reports),
        "gaps": sum(r["gaps"] for r in reports),
        "repeats": sum(r["repeats"] for r in reports),
    }


def checkpoint(plan: Plan) -> dict[str, Any]:
    """:func:`tools.bench_checkpoint.measure`: 8 world sessions, K = :data:`EVERY`."""
    return bench_checkpoint.measure(8, plan.checkpoint_steps, EVERY, plan.checkpoint_rounds)


def _rte_drain(daemon: str) -> str:
    """``rte drain DAEMON``, as a user runs it; its line saying how long it took."""
    command = [sys.executable, "-m", "rte", "drain", daemon, "--timeout", "60"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    line = next((x for x in done.stdout.splitlines() if " left it in " in x), None)
    if done.returncode != 0 or line is None:
        raise RteError(f"bench_state: rte drain {daemon} failed: {done.stdout}{done.stderr}")
    return line


def replay(plan: Plan) -> dict[str, Any]:
    """A walk recorded through a daemon at the pace, made again flat out in process."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "walk.jsonl"
        with (
            daemons([daemon_name()], [*WORLD, "--max-sessions", "2"]) as (daemon,),
            daemon.connect() as client,
            Recorder(client, path) as recorder,
        ):
            recorder.attach("walker", {"prompt": "a forest"}, credits=1)
            taken = 0
            while taken < plan.replay_chunks:
                chunk = recorder.poll(TIMEOUT_S)
                if chunk is None:
                    raise RteError(f"bench_state: no chunk of the walk in {TIMEOUT_S:g} s")
                with chunk:
                    if taken + 1 < plan.replay_chunks:
                        recorder.act("walker", {"move": (taken % 3 - 1, 1)})
                    taken += 1
            recorder.detach("walker")
        trace = read_trace(path)
    with ComposedEngine(load_model("world", max_sessions=2)) as engine:
        result = replay_engine(trace, engine)
    return {
        "chunks": result.chunks,
        "identical": result.identical,
        "chunks_per_s": result.speed,
        "x_real_time": result.speed / PACE_HZ,
        "recorded_hz": result.pace,
    }


def crash(plan: Plan) -> dict[str, Any]:
    """SIGKILL of the daemon streaming ``a`` in a pool reattaching from checkpoints,
    :attr:`Plan.crashes` times at chunks spread over the checkpoint cycle."""
    lost: list[int] = []
    for trial in range(plan.crashes):
        kill_at = EVERY + 3 + trial * EVERY // max(1, plan.crashes)
        lost.append(_crash_once(kill_at))
    return {
        "every": EVERY,
        "crashes": plan.crashes,
        "lost": lost,
        "lost_p50": float(np.percentile(lost, 50)),
        "lost_max": max(lost),
    }


def _crash_once(kill_at: int) -> int:
    """The chunks of ``a`` made again after its daemon is killed past chunk ``kill_at``."""
    options = [*WORLD, "--max-sessions", "2", "--checkpoint-every", str(EVERY)]
    with daemons([daemon_name(), daemon_name()], options) as two:
        names = [d.name for d in two]
        client = connect_pool(names, timeout=30, reattach=True, recover=read_checkpoint)
        with client:
            streams = Streams(client, PERIOD_NS)
            client.attach("a", {"prompt": "a forest"})
            streams.until("a", kill_at)
            doomed = next(d for d in two if d.name == client.home["a"])
            doomed.kill()
            deadline = time.monotonic() + TIMEOUT_S
            while client.home.get("a") in (None, doomed.name):
                if time.monotonic() > deadline:
                    raise RteError("bench_state: 'a' was not reattached on the survivor")
                streams.take(0.1)  # what the dead one sent before it died
            seen = streams.last("a")
            told = [
                n for n in client.notices() if n.kind is NoticeKind.ATTACHED and n.session == "a"
            ]
            if not told or "checkpoint" not in told[-1].message:
                raise RteError(f"bench_state: 'a' was not resumed from a checkpoint: {told}")
            resumed_at = int(told[-1].message.rsplit(" ", 1)[-1])
            return seen + 1 - resumed_at


# -- the whole -----------------------------------------------------------------------


def _row(figure: str, values: Any, unit: str, target: str = "", met: bool | None = None) -> Any:
    p50, p99 = values if isinstance(values, tuple) else (values, None)
    verdict = "" if met is None else ("yes" if met else "no")
    return {"figure": figure, "p50": p50, "p99": p99, "unit": unit, "target": target,
            "met": verdict}  # fmt: skip


def summary(r: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: p50, p99 (None: one value), unit, target, whether met."""
    s, m, d = r["suspend"], r["migrate"], r["drain"]
    c, p, k = r["checkpoint"], r["replay"], r["crash"]
    moved = pair(m, "stall_periods")
    lost = (k["lost_p50"], float(k["lost_max"]))
    e = r["rte_drain"]
    return [
        _row("suspend call", pair(s, "suspend_periods"), "periods"),
        _row("resume call", pair(s, "resume_periods"), "periods"),
        _row("suspend+resume stall", pair(s, "stall_periods"), "periods"),
        _row("migrate call", pair(m, "call_periods"), "periods"),
        _row("migration stall", moved, "periods", "<= 2", moved[1] <= MIGRATION_TARGET),
        _row(f"drain {d['sessions']} sessions, {d['clients']} clients", d["seconds"], "s"),
        _row("drain stall per session", pair(d, "stall_periods"), "periods"),
        _row(f"rte drain {e['sessions']} sessions, {e['clients']} clients", e["seconds"], "s"),
        _row("rte drain stall per session", pair(e, "stall_periods"), "periods"),
        _row(
            f"checkpoint per step, K={c['every']}",
            c["share_pct"],
            "% of a step",
            "<= 5",
            c["share_pct"] <= CHECKPOINT_TARGET,
        ),
        _row("checkpoint bytes per session", float(c["state_bytes"]), "bytes"),
        _row("replay flat out", p["x_real_time"], "x real time"),
        _row(
            f"crash: chunks lost, K={k['every']}",
            lost,
            "chunks",
            f"<= {k['every']}",
            k["lost_max"] <= k["every"],
        ),
    ]


def run(plan: Plan = Plan()) -> dict[str, Any]:
    """Every part, in turn (a line on stderr after each): the suite's result."""
    parts: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("suspend", lambda: suspend_resume(plan)),
        ("migrate", lambda: migrate(plan)),
        ("drain", lambda: drain(plan)),
        ("rte_drain", lambda: drain(plan, daemon_wide=True)),
        ("checkpoint", lambda: checkpoint(plan)),
        ("replay", lambda: replay(plan)),
        ("crash", lambda: crash(plan)),
    ]
    result: dict[str, Any] = {"windows": 1, "pace_hz": PACE_HZ, "every": EVERY}
    for done, (part, measure) in enumerate(parts, 1):
        began = time.monotonic()
        result[part] = measure()
        report.progress("state", done, len(parts), f"{part} ({time.monotonic() - began:.1f} s)")
    result["rows"] = summary(result)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    parser.add_argument("--quick", action="store_true", help="a few of each (a smoke run)")
    args = parser.parse_args(argv)
    report.emit(run(QUICK if args.quick else Plan()), TABLES, args.json)


if __name__ == "__main__":
    main()
