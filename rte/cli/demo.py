"""``rte demo``: the main job, end to end, on the trained world model.

Launches a daemon in a child process (or attaches to ``--name``), attaches
several sessions from a client, each with its own prompt (a forest, a desert
at night...) and walking its own way, streams for a few seconds while
steering them, shows per-session chunks/s and chunk latency (generated in the
daemon to received here), optionally writes a PNG contact sheet of the first
frames of each walk (labelled by session, prompt and direction), and shuts
everything down, leaving nothing in /dev/shm. A demo killed any other way,
SIGKILL included, stops its daemon too (:class:`rte.launch.LaunchedDaemon`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rte.cli.options import add_daemon_choice
from rte.cli.progress import Waiting
from rte.cli.sheet import contact_sheet, write_png
from rte.client import EngineClient, connect
from rte.errors import ConfigurationError
from rte.launch import LaunchedDaemon, unique_name
from rte.launch.daemon import CLEAN_EXITS

DEFAULT_MODEL = "world"
PROMPTS = (
    "a forest",
    "a desert at night",
    "snow",
    "ocean islands",
    "lava volcano",
    "misty meadow",
    "woods at night",
    "foggy sand dunes",
)
WALKS = (((0, 1), "right"), ((1, 0), "down"), ((0, -1), "left"), ((-1, 0), "up"))
SHEET_EVERY = 4  # the sheet shows every 4th chunk: the walk moves 4 px a frame


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="launch a daemon, stream sessions from a client, show rates",
        description="Launch a daemon, stream sessions from a client process, show rates.",
    )
    add_daemon_choice(p, DEFAULT_MODEL)
    p.add_argument(
        "--sessions", type=int, default=4, help="sessions to stream, at least 1 (default 4)"
    )
    p.add_argument(
        "--seconds", type=float, default=3.0, help="how long to stream, above 0 (default 3)"
    )
    p.add_argument("--png", help="write a contact sheet of decoded frames to this PNG file")
    p.set_defaults(func=demo)


def demo(args: argparse.Namespace) -> int:
    png = Path(args.png) if args.png else None
    if png is not None:
        _check_writable(png)  # before anything streams
    if args.sessions < 1:
        raise ConfigurationError(f"--sessions {args.sessions}: at least 1")
    if not args.seconds > 0 or math.isinf(args.seconds):
        raise ConfigurationError(f"--seconds {args.seconds}: a number of seconds above 0")
    if not 0 <= args.wait < math.inf:
        raise ConfigurationError(f"--wait {args.wait}: 0 (no waiting) or more seconds")
    daemon = None
    if args.name is None:
        options = ["--model", args.model, "--max-sessions", str(args.sessions)]
        options += ["--device", args.device] if args.device else []
        # A session of its own: a Ctrl-C at the terminal (SIGINT to the whole
        # foreground process group) reaches the demo alone, which prints its
        # summary and then stops the daemon itself. It dies with us all the same,
        # SIGKILL included (we launch it from the main thread).
        daemon = LaunchedDaemon(unique_name("demo"), options, own_session=True)
    elif args.wait > 0:
        print(f"rte demo: waiting up to {args.wait:g} s for daemon {args.name!r}", file=sys.stderr)
    try:
        with _connect(args.name, daemon, args.wait) as client:
            sheet, interrupted = _stream(client, args.sessions, args.seconds, png is not None)
        if png is not None and sheet is not None:
            write_png(png, sheet)
            print(f"contact sheet: {png} ({sheet.shape[1]}x{sheet.shape[0]})")
    finally:
        if daemon is not None:
            _stop(daemon)
    if interrupted:
        print("rte demo: interrupted; the summary above is of what came before", file=sys.stderr)
        return 130
    return 0


def _check_writable(png: Path) -> None:
    folder = png.parent if str(png.parent) else Path(".")
    if png.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ConfigurationError(f"--png {png}: cannot write there")


def _connect(name: str | None, daemon: LaunchedDaemon | None, wait: float) -> EngineClient:
    """A client of the daemon this demo launched once it is up (if it exits first,
    its own words, at once), or of the one ``--name`` says, running now or within
    ``--wait``."""
    if daemon is not None:
        with Waiting("rte demo") as progress:
            return daemon.connect(progress=progress)
    assert name is not None
    return connect(name, timeout=wait or None)


def _stop(daemon: LaunchedDaemon) -> None:
    if daemon.stop() in CLEAN_EXITS:  # (killed, its leftovers are removed)
        print(f"daemon stopped; left in /dev/shm: {daemon.leftovers() or 'nothing'}")


def _stream(
    client: EngineClient, n: int, seconds: float, want_frames: bool
) -> tuple[np.ndarray[Any, Any] | None, bool]:
    """Stream ``n`` sessions for ``seconds``; the contact sheet (if wanted) and whether
    Ctrl-C cut it short."""
    sessions = [f"session-{i}" for i in range(n)]
    labels = []
    for i, session in enumerate(sessions):
        prompt, (move, way) = PROMPTS[i % len(PROMPTS)], WALKS[i % len(WALKS)]
        client.attach(session, {"prompt": prompt, "move": move})
        labels.append(f"{session}: {prompt}, walking {way}")
    manifest = client.manifest
    print(
        f"rte demo: daemon {client.name!r}, model {manifest.model}, {n} sessions, chunk "
        f"{manifest.latent_shape} {manifest.latent_dtype}, pipeline depth "
        f"{manifest.pipeline_depth_chunks}"
    )
    latency: dict[str, list[int]] = {s: [] for s in sessions}
    frames: dict[str, list[np.ndarray[Any, Any]]] = {s: [] for s in sessions}
    start = time.monotonic()
    try:
        _steer_and_take(client, sessions, seconds, latency, frames, want_frames)
        interrupted = False
    except KeyboardInterrupt:  # Ctrl-C: the summary of what came, not a traceback
        interrupted = True
    elapsed = time.monotonic() - start
    print(f"{'session':<12}{'chunks':>8}{'chunks/s':>10}{'latency p50 ms':>16}{'p99 ms':>9}")
    for session in sessions:
        lat = np.asarray(latency[session], dtype=np.float64) / 1e6
        p50, p99 = np.percentile(lat, [50, 99]) if lat.size else (float("nan"),) * 2
        print(f"{session:<12}{lat.size:>8}{lat.size / elapsed:>10.1f}{p50:>16.3f}{p99:>9.3f}")
    for session in sessions:  # after the summary: what came is said whatever happens here
        client.detach(session)
    if not want_frames:
        return None, interrupted
    return contact_sheet([frames[s] for s in sessions], labels), interrupted


def _steer_and_take(
    client: EngineClient,
    sessions: list[str],
    seconds: float,
    latency: dict[str, list[int]],
    frames: dict[str, list[np.ndarray[Any, Any]]],
    want_frames: bool,
) -> None:
    """Take chunks for ``seconds``, steering every half second and saying the rate."""
    start = time.monotonic()
    next_report = start + 0.5
    steer = 0
    while (now := time.monotonic()) - start < seconds:
        for chunk in client.results(timeout=0.05):
            with chunk:
                latency[chunk.session].append(time.monotonic_ns() - chunk.timing.generated_ns)
                taken = frames[chunk.session]
                if want_frames and chunk.chunk % SHEET_EVERY == 0 and len(taken) < 8:
                    taken.append(chunk.latent.copy())  # the walk's first steps
            if time.monotonic() >= next_report:
                break
        if now >= next_report:
            steer += 1
            for i, session in enumerate(sessions):  # a turn every half second
                client.act(session, {"move": WALKS[(i + steer) % len(WALKS)][0]})
            if steer == 3:
                client.act(sessions[0], {"prompt": "lava at night"})  # a heavy change: ENCODE
            total = sum(len(v) for v in latency.values())
            print(
                f"  {now - start:4.1f}s  {total / (now - start):9.1f} chunks/s in all", flush=True
            )
            next_report += 0.5
