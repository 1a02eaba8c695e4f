"""End to end with a large input: a 512x512x3 uint8 frame in per step, in process vs daemon.

What does a big input cost through the daemon? The reference model blends its
``frame`` key into every later output; a round sends a frame (alternately
black and white, so the chunk that shows it is plain to see: its mean crosses
127) and times, on ``time.monotonic_ns``, until a chunk shows it. One session,
credits 1 (each round waits for its chunk: the latency an interactive
video-in caller sees). Two ways to hand the frame over, one row each:

* ``by_value``: ``client.act(s, {"frame": frame})`` with a frame the caller
  already has. In process the engine reads that array; through the daemon it
  is copied once into a slot of the input slab, and only its reference
  crosses the ring.
* ``loan``: ``with client.loan(shape, dtype) as frame:`` the caller writes the
  frame in place (a fill here, as a camera would), then acts. In process the
  loan is a plain array; through the daemon it is the slot itself: no copy.

Each row gives both sides' p50/p99 action-to-chunk latency, frames per second
(rounds over their time) and ``added`` (daemon minus in process, per window),
the median over windows with the half-range spread (``tools.report``).

    python -m tools.bench_inputs [--windows 5] [--rounds 100] [--json]
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import numpy as np

from rte.client import EngineClient, InProcessClient
from rte.composed import ComposedEngine
from rte.models.reference import ReferenceModel
from tools import report
from tools.bench_e2e import TIMEOUT_S, Daemon

SHAPE = (512, 512, 3)
WAYS = ("by_value", "loan")

TABLES: list[report.TableSpec] = [
    (
        "end to end, a 512x512x3 uint8 frame in per step (reference model, 1 session)",
        "rows",
        {},
        [
            "way",
            "inproc_p50_us",
            "daemon_p50_us",
            "added_p50_us",
            "inproc_p99_us",
            "daemon_p99_us",
            "inproc_fps",
            "daemon_fps",
            "fps_ratio",
        ],
    )
]


def _rounds(client: EngineClient, way: str, rounds: int) -> dict[str, float]:
    """``rounds`` frames, each until the chunk that shows it: latencies and frames/s."""
    client.attach("s", credits=1)
    frames = [np.zeros(SHAPE, np.uint8), np.full(SHAPE, 255, np.uint8)]
    took = []
    began = time.monotonic_ns()
    for i in range(rounds):
        bright = i % 2 == 1
        sent = time.monotonic_ns()
        if way == "loan":
            with client.loan(SHAPE, "uint8") as frame:
                frame.fill(255 if bright else 0)
                client.act("s", {"frame": frame})
        else:
            client.act("s", {"frame": frames[bright]})
        while True:
            batch = client.poll_batch(timeout=TIMEOUT_S)
            if batch is None:
                raise RuntimeError(f"no chunk in {TIMEOUT_S}s")
            with batch:
                shows = any((float(latent.mean()) > 127) == bright for latent in batch.latents)
            if shows:
                took.append(time.monotonic_ns() - sent)
                break
    seconds = (time.monotonic_ns() - began) / 1e9
    client.detach("s")
    figures = report.percentiles_us(took)
    return {"p50_us": figures["p50_us"], "p99_us": figures["p99_us"], "fps": rounds / seconds}


def _window(daemon: Daemon, way: str, rounds: int) -> dict[str, float]:
    with InProcessClient(ComposedEngine(ReferenceModel(1))) as client:
        local = _rounds(client, way, rounds)
    with daemon.connect() as client:
        remote = _rounds(client, way, rounds)
    return {
        "inproc_p50_us": local["p50_us"],
        "daemon_p50_us": remote["p50_us"],
        "added_p50_us": remote["p50_us"] - local["p50_us"],
        "inproc_p99_us": local["p99_us"],
        "daemon_p99_us": remote["p99_us"],
        "inproc_fps": local["fps"],
        "daemon_fps": remote["fps"],
        "fps_ratio": remote["fps"] / local["fps"],
    }


def run(
    rounds: int = 100, n_windows: int = report.DEFAULT_WINDOWS, prefix: str = "bench"
) -> dict[str, Any]:
    progress = report.Progress("inputs", len(WAYS))
    daemon = Daemon(1, prefix=prefix, model="reference")
    rows = []
    try:
        for way in WAYS:
            measure = functools.partial(_window, daemon, way, rounds)
            summary = progress.measure(f"way={way}", measure, n_windows, "added_p50_us", "µs")
            rows.append({"way": way, **summary})
    finally:
        daemon.close()
    return {"bench": "inputs", "machine": report.machine(), "windows": n_windows, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=report.DEFAULT_WINDOWS)
    parser.add_argument("--rounds", type=int, default=100, help="frames per side and window")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.rounds, args.windows)
    report.emit(result, TABLES, args.json)


if __name__ == "__main__":
    main()
