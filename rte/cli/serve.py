"""``rte serve``: run the engine daemon in the foreground until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rte.errors import ConfigurationError
from rte.ipc.process import run_from_command_line
from rte.ipc.settings import Settings
from rte.serve import DEFAULT_CREDITS


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the engine daemon in the foreground",
        description="Run the engine daemon until SIGTERM or Ctrl-C; clients connect by --name.",
    )
    p.add_argument("--name", required=True, help="the daemon's name (clients connect by it)")
    p.add_argument("--model", default="reference", help="short name or module:factory")
    p.add_argument("--max-sessions", type=int, default=8, help="rows of the engine's arena")
    p.add_argument("--max-clients", type=int, default=8, help="client processes at once")
    p.add_argument("--ring-kib", type=int, default=256, help="each client ring's size")
    p.add_argument("--slab-slots", type=int, default=64, help="chunks in flight in all")
    p.add_argument("--quota", type=int, default=0, help="slots per client (0: an even share)")
    p.add_argument(
        "--credits",
        type=int,
        default=DEFAULT_CREDITS,
        help="chunks a session may have emitted and not released before it waits for its "
        f"client (default {DEFAULT_CREDITS}; a client may ask for others per attach)",
    )
    p.add_argument(
        "--device",
        help="where the model computes: cpu, cuda or cuda:N (one daemon per GPU; "
        "default: the model's own choice)",
    )
    p.add_argument("--pace-hz", type=float, default=0.0, help="steps per second (0: flat out)")
    p.add_argument(
        "--wait-policy", default="spin-then-block", choices=["spin", "spin-then-block", "block"]
    )
    p.add_argument(
        "--idle-limit-s", type=float, default=30.0, help="detach the sessions of a stalled client"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = Settings(
            name=args.name,
            model=args.model,
            max_sessions=args.max_sessions,
            max_clients=args.max_clients,
            ring_kib=args.ring_kib,
            slab_slots=args.slab_slots,
            quota=args.quota,
            credits=args.credits,
            pace_hz=args.pace_hz,
            wait_policy=args.wait_policy,
            idle_limit_s=args.idle_limit_s,
            device=args.device,
        )
    except ConfigurationError as exc:
        print(f"rte serve: {exc}", file=sys.stderr)
        return 2
    return run_from_command_line(settings)
