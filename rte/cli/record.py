"""``rte record``: drive a session of a running daemon with scripted moves, record its trace.

A small recorder for commands that run (the docs' record then replay): it
attaches ``--session`` to the daemon ``--name`` with one credit, sends one move
of ``--moves`` after each chunk it takes (``R``, ``L``, ``U``, ``D``: right,
left, up, down; ``S``: stand still), a prompt change where ``--prompt-at
K:TEXT`` says (after chunk K), and writes the session's trace
(:mod:`rte.trace`) through a :class:`rte.recorder.Recorder`, stopping after
``--chunks`` chunks. ``rte replay`` makes it again.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rte.client import NoticeKind, connect
from rte.errors import ConfigurationError, RteError
from rte.recorder import Recorder

MOVES = {"R": (0, 1), "L": (0, -1), "U": (-1, 0), "D": (1, 0), "S": (0, 0)}
CHUNK_TIMEOUT_S = 10.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "record",
        help="drive a session of a running daemon with scripted moves and record its trace",
        description="Attach a session to a running daemon, send one scripted move after "
        "each chunk, and write the session's trace (JSON lines: its attach, each action "
        "with the chunk it applied at, every chunk's hash) for rte replay.",
    )
    p.add_argument("--name", required=True, help="the running daemon (rte serve --name NAME)")
    p.add_argument("--session", required=True, help="the session's id (its seed too)")
    p.add_argument("--prompt", help="the session's prompt at attach")
    p.add_argument("--chunks", type=int, required=True, help="chunks to record, at least 1")
    p.add_argument("--out", required=True, help="the trace file to write")
    p.add_argument(
        "--device",
        help="where the daemon computes (cpu, cuda, cuda:N), into the trace's header: "
        "rte replay computes there by default (default: not said, replayed on cpu)",
    )
    p.add_argument(
        "--moves",
        default="",
        help="one move a chunk, comma-separated: R, L, U, D (right, left, up, down) or S "
        "(stand still); e.g. R,R,D,D (default: none)",
    )
    p.add_argument(
        "--prompt-at",
        action="append",
        default=[],
        metavar="K:TEXT",
        help="after chunk K, change the prompt to TEXT (repeatable)",
    )
    p.set_defaults(func=record)


def parse_moves(text: str) -> list[tuple[int, int]]:
    """``R,R,D`` as moves; ConfigurationError naming a letter that is none."""
    moves = []
    for i, letter in enumerate(m.strip().upper() for m in text.split(",") if m.strip()):
        if letter not in MOVES:
            raise ConfigurationError(
                f"--moves: {letter!r} (move {i + 1}) is not one of R, L, U, D, S"
            )
        moves.append(MOVES[letter])
    return moves


def parse_prompts(items: list[str]) -> dict[int, str]:
    """``K:TEXT`` items as chunk -> prompt."""
    prompts = {}
    for item in items:
        k, sep, text = item.partition(":")
        if not sep or not k.strip().isdigit():
            raise ConfigurationError(f"--prompt-at {item!r}: K:TEXT, K a chunk index")
        prompts[int(k)] = text
    return prompts


def record(args: argparse.Namespace) -> int:
    if args.chunks < 1:
        raise ConfigurationError(f"--chunks {args.chunks}: at least 1")
    moves, prompts = parse_moves(args.moves), parse_prompts(args.prompt_at)
    out, session = Path(args.out), args.session
    conditioning = {} if args.prompt is None else {"prompt": args.prompt}
    taken = acted = 0
    with (
        connect(args.name) as client,
        Recorder(client, out, session=session, device=args.device) as recorder,
    ):
        recorder.attach(session, conditioning, credits=1)
        while taken < args.chunks:
            chunk = recorder.poll(CHUNK_TIMEOUT_S)
            if chunk is None:
                raise RteError(
                    f"no chunk of {session!r} from {args.name!r} in {CHUNK_TIMEOUT_S:g} s"
                )
            with chunk:  # the session's one credit: it is stepped again once this is back
                if chunk.session != session:
                    continue
                action: dict[str, Any] = {}
                if taken < len(moves):
                    action["move"] = moves[taken]
                if chunk.chunk in prompts:
                    action["prompt"] = prompts[chunk.chunk]
                if action and taken + 1 < args.chunks:
                    recorder.act(session, action)
                    acted += 1
                taken += 1
        recorder.detach(session)
        notices = recorder.notices()
        refused = [n.message for n in notices if n.kind is NoticeKind.ERROR]
        trace = recorder.recording
    if trace is not None and trace.error is not None:  # the stream went on; the trace did not
        raise RteError(
            f"the trace of {session!r} to {out} stopped after {trace.chunks} of {taken} chunks "
            f"({trace.error}): it is cut short; record again to a disk with room"
        )
    print(f"recorded {taken} chunks of {session!r} from {args.name!r} to {out} ({acted} actions)")
    for message in refused:
        print(f"refused: {message}")
    return 0
