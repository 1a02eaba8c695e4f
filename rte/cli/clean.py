"""``rte clean NAME``: remove what a dead daemon left in /dev/shm (refused for a live one)."""

from __future__ import annotations

import argparse
from typing import Any

from rte.ipc.inspect import remove_leftovers


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "clean",
        help="remove what a dead daemon left in /dev/shm",
        description="Remove the segments and semaphores a dead daemon left in /dev/shm. "
        "A live daemon is refused: stop it instead (SIGTERM or Ctrl-C).",
    )
    p.add_argument("name", help="the daemon's name")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    removed = remove_leftovers(args.name)
    print(f"removed {len(removed)} objects of {args.name!r}: {' '.join(removed) or '-'}")
    return 0
