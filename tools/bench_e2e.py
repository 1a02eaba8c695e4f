"""End to end: action sent to the chunk that reflects it, through a daemon and in process.

This answers the seed's open question (does the outbox add latency against a
direct callback?). The model is the null model (zero-cost stages) whose chunks
carry the session's last ``tag``; a round sends a new tag to one session and
times until a chunk of that session carries it. Both loops step continuously:

* in process: ``ComposedEngine.step`` in a loop that hands each chunk to a
  callback on the same thread (a direct in-process callback);
* daemon: ``rte serve --model null`` in another process, the action over the
  inbox ring, the chunk back over the outbox ring and the slab.

Both include the engine's two-chunk pipeline, so the difference is what the
process boundary costs. Also: chunks/s through the daemon at the largest size.

    python -m tools.bench_e2e [--sessions 1 8 64] [--rounds 300] [--json] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

from rte.client import EngineClient, connect
from rte.composed import ComposedEngine
from rte.contract import Action, StepResult
from rte.ipc.names import DaemonNames
from rte.models.null import NullModel, tag_of
from tools.report import percentiles_us, print_json, print_table


def in_process(sessions: int, rounds: int) -> list[int]:
    """Per-round ns from handing the action to the engine to the callback seeing
    the tagged chunk. One thread: the callback runs on the stepping thread."""
    engine = ComposedEngine(NullModel(sessions), lanes="cpu")
    names = [f"s{i}" for i in range(sessions)]
    for name in names:
        engine.attach(name)
    for _ in range(4):
        engine.step(names)
    samples: list[int] = []
    sent: list[int] = []  # when the current round's action went in (empty: none yet)

    def callback(result: StepResult) -> None:
        r = len(samples)
        assert result.latent is not None
        if sent and result.session == names[r % sessions] and tag_of(result.latent) == r:
            samples.append(time.perf_counter_ns() - sent.pop())

    deadline = time.monotonic() + 60
    while len(samples) < rounds and time.monotonic() < deadline:
        actions = {}
        if not sent:
            r = len(samples)
            actions[names[r % sessions]] = Action({"tag": r})
            sent.append(time.perf_counter_ns())
        for result in engine.step(names, actions):
            if result.has_chunk:
                callback(result)
    engine.close()
    return samples


class _Daemon:
    def __init__(self, sessions: int) -> None:
        self.name = f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        command = [sys.executable, "-m", "rte", "serve", "--name", self.name, "--model", "null"]
        command += ["--max-sessions", str(sessions), "--max-clients", "2"]
        command += ["--slab-slots", str(4 * sessions + 8), "--quota", str(2 * sessions + 4)]
        self.process = subprocess.Popen(command, stderr=subprocess.DEVNULL)

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        DaemonNames(self.name).remove_leftovers()


def _drain_until(client: EngineClient, session: str, tag: int) -> int:
    while True:
        chunk = client.poll(timeout=10)
        if chunk is None:
            raise RuntimeError("daemon round timed out")
        with chunk:
            if chunk.session == session and tag_of(chunk.latent) == tag:
                return time.perf_counter_ns()


def through_daemon(sessions: int, rounds: int, rate_seconds: float) -> tuple[list[int], float]:
    """Per-round ns from act to the client holding the tagged chunk; and chunks/s."""
    daemon = _Daemon(sessions)
    try:
        with connect(daemon.name, timeout=60) as client:
            names = [f"s{i}" for i in range(sessions)]
            for name in names:
                client.attach(name)
            for _ in range(4 * sessions):  # warm up: fill the pipeline
                chunk = client.poll(timeout=10)
                if chunk is not None:
                    chunk.release()
            samples = []
            for r in range(rounds):
                session = names[r % sessions]
                t0 = time.perf_counter_ns()
                client.act(session, {"tag": r})
                samples.append(_drain_until(client, session, r) - t0)
            count, began = 0, time.monotonic()
            while time.monotonic() - began < rate_seconds:
                chunk = client.poll(timeout=10)
                if chunk is not None:
                    chunk.release()
                    count += 1
            rate = count / (time.monotonic() - began)
    finally:
        daemon.close()
    return samples, rate


def run(sizes: list[int], rounds: int, rate_seconds: float = 2.0) -> dict[str, Any]:
    rows = []
    for n in sizes:
        local = percentiles_us(in_process(n, rounds))
        remote_samples, rate = through_daemon(n, rounds, rate_seconds)
        remote = percentiles_us(remote_samples)
        rows.append(
            {
                "sessions": n,
                "inproc_p50_us": local["p50_us"],
                "inproc_p99_us": local["p99_us"],
                "daemon_p50_us": remote["p50_us"],
                "daemon_p99_us": remote["p99_us"],
                "added_p50_us": remote["p50_us"] - local["p50_us"],
                "added_p99_us": remote["p99_us"] - local["p99_us"],
                "daemon_chunks_per_s": rate,
            }
        )
    return {
        "bench": "end_to_end",
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "rounds": rounds,
        "rows": rows,
    }


def plot(result: dict[str, Any], path: str) -> None:
    """Bars of p50/p99 in process and through the daemon (needs matplotlib)."""
    try:
        import matplotlib  # noqa: PLC0415 (optional)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install -e '.[plot]'") from None
    rows = result["rows"]
    labels = [str(r["sessions"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.2
    for k, key in enumerate(["inproc_p50_us", "inproc_p99_us", "daemon_p50_us", "daemon_p99_us"]):
        ax.bar(
            [i + (k - 1.5) * width for i in range(len(rows))],
            [r[key] for r in rows],
            width,
            label=key,
        )
    ax.set_xticks(range(len(rows)), labels)
    ax.set_xlabel("sessions")
    ax.set_ylabel("action to chunk, µs")
    ax.set_title("rte: in-process callback vs daemon over shared memory")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", metavar="FILE.png")
    args = parser.parse_args(argv)
    result = run(args.sessions, args.rounds)
    if args.plot:
        plot(result, args.plot)
    if args.json:
        print_json(result)
        return
    print_table(
        "Action to the chunk that reflects it (null model): direct callback vs daemon",
        result["rows"],
        [
            "sessions",
            "inproc_p50_us",
            "inproc_p99_us",
            "daemon_p50_us",
            "daemon_p99_us",
            "added_p50_us",
            "added_p99_us",
            "daemon_chunks_per_s",
        ],
    )


if __name__ == "__main__":
    main()
