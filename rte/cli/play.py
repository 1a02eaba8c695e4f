"""``rte play``: play a model in a browser, one session per tab.

Launches a daemon in a child process (or attaches to ``--name``), serves a page
on 127.0.0.1 and streams each tab's frames to a canvas over a WebSocket;
arrow keys or WASD move, a text box changes the prompt, a button resets. The
server is :mod:`rte.play` on aiohttp, an optional extra (``pip install
'rte[play]'``), imported only when this command runs.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from rte.cli.options import add_daemon_choice
from rte.errors import ConfigurationError

DEFAULT_MODEL = "world"  # the model a launched daemon serves: the trained world
DEFAULT_PROMPT = "a forest"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "play",
        help="play a model in a browser: a page on 127.0.0.1, one session per tab",
        description="Serve a page on 127.0.0.1 where each browser tab is a session of a "
        "daemon (launched here, or --name): frames on a canvas, arrow keys or WASD "
        "move, a text box sets the prompt, a button resets. Needs rte[play] (aiohttp).",
    )
    add_daemon_choice(p, DEFAULT_MODEL)
    p.add_argument(
        "--port",
        type=int,
        default=8000,
        help="the page's port on 127.0.0.1 (0: a free one; default 8000)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=8,
        help="a launched daemon's rows: tabs at once (default 8)",
    )
    p.add_argument(
        "--pace-hz", type=float, default=30.0, help="a launched daemon's steps/s (default 30)"
    )
    p.add_argument(
        "--max-fps", type=float, default=60.0, help="frames/s sent to a tab at most (default 60)"
    )
    p.add_argument(
        "--prompt",
        default=DEFAULT_PROMPT,
        help=f"a new tab's first prompt (default {DEFAULT_PROMPT!r})",
    )
    p.add_argument(
        "--transport",
        choices=("webrtc", "websocket"),
        default="webrtc",
        help="webrtc (default): encoded video and a data channel, the page falls back to "
        "the WebSocket if its browser cannot; websocket: raw RGB frames over a WebSocket only",
    )
    p.add_argument(
        "--ice-server",
        action="append",
        default=[],
        metavar="URL[,USER,PASSWORD]",
        help="a STUN or TURN server for WebRTC (repeatable; none by default: this machine "
        "and its LAN need none, a viewer behind NAT needs one)",
    )
    p.add_argument(
        "--ice-host",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="a local address WebRTC offers its media on (repeatable; default 127.0.0.1)",
    )
    p.add_argument(
        "--scale",
        type=int,
        default=0,
        help="the video's integer upscale of a frame (default 0: its long side to 256 px)",
    )
    p.add_argument(
        "--record",
        type=Path,
        metavar="DIR",
        help="record each session to DIR/SESSION.mp4 with its actions in DIR/SESSION.jsonl",
    )
    p.add_argument(
        "--record-traces",
        type=Path,
        metavar="DIR",
        help="write each session's trace to DIR/SESSION.trace.jsonl (its actions and "
        "every chunk's hash: rte replay makes it again)",
    )
    p.set_defaults(func=play)


def play(args: argparse.Namespace) -> int:
    try:
        from rte.play.server import PlaySettings, run  # noqa: PLC0415 (aiohttp: only here)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "aiohttp":
            raise
        raise ConfigurationError("rte play needs aiohttp: pip install 'rte[play]'") from None
    if args.max_fps <= 0:
        raise ConfigurationError(f"--max-fps {args.max_fps}: must be above 0")
    if args.max_sessions < 1:
        raise ConfigurationError(f"--max-sessions {args.max_sessions}: at least 1")
    if args.pace_hz < 0:
        raise ConfigurationError(f"--pace-hz {args.pace_hz}: 0 (flat out) or more")
    if not 0 <= args.wait < math.inf:
        raise ConfigurationError(f"--wait {args.wait}: 0 (no waiting) or more seconds")
    if args.transport == "webrtc" or args.record is not None:
        try:
            import rte.play.webrtc  # noqa: F401, PLC0415 (aiortc and PyAV: only here)
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] not in ("aiortc", "av", "aioice"):
                raise
            raise ConfigurationError(
                f"rte play's video needs {exc.name}: pip install 'rte[play]' "
                "(or --transport websocket without --record)"
            ) from None
    if args.scale < 0:
        raise ConfigurationError(f"--scale {args.scale}: 0 (automatic) or more")
    if args.record_traces is not None:
        from rte.play.traces import TraceFiles  # noqa: PLC0415 (a bad DIR: before any daemon)

        TraceFiles(args.record_traces)
    if args.name is not None and args.wait > 0:
        print(f"rte play: waiting up to {args.wait:g} s for daemon {args.name!r}", file=sys.stderr)

    return run(
        PlaySettings(
            name=args.name,
            model=args.model,
            port=args.port,
            max_sessions=args.max_sessions,
            pace_hz=args.pace_hz,
            max_fps=args.max_fps,
            prompt=args.prompt,
            device=args.device,
            wait_s=args.wait,
            transport=args.transport,
            ice_servers=tuple(args.ice_server),
            ice_hosts=tuple(args.ice_host) or ("127.0.0.1",),
            scale=args.scale,
            record=args.record,
            traces=args.record_traces,
        )
    )
