"""``rte clean NAME``: remove what a dead daemon left in /dev/shm (refused for a live one).

NAME may be a pool's (``rte serve --name NAME --replicas N``): then every
``NAME-i`` that left something is cleaned. A name with nothing in /dev/shm
is a mistake (exit 1, naming the daemons there are), never "removed 0
objects": a typo must not pass for a clean.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from rte.client.daemon import running_ones
from rte.errors import RteError
from rte.ipc.inspect import remove_leftovers
from rte.protocol.names import DaemonNames
from shm.names import objects, shm_name


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "clean",
        help="remove what a dead daemon left in /dev/shm",
        description="Remove the segments and semaphores a dead daemon (or every member "
        "NAME-i of a dead pool) left in /dev/shm. A live daemon is refused: stop it "
        "instead (SIGTERM or Ctrl-C).",
    )
    p.add_argument("name", help="the daemon's name (or the pool's)")
    p.set_defaults(func=run)


def pool_members(name: str) -> list[str]:
    """``NAME-0``, ``NAME-1``... that have any object in /dev/shm, in order."""
    prefix = shm_name(name) + "-"
    found = {obj[len(prefix) :].partition(".")[0] for obj in objects(prefix)}
    indices = sorted(int(i) for i in found if re.fullmatch(r"\d+", i))
    return [f"{name}-{i}" for i in indices]


def run(args: argparse.Namespace) -> int:
    name = args.name
    if DaemonNames(name).leftovers():
        targets = [name]
    elif members := pool_members(name):
        targets = members
    else:
        raise RteError(f"nothing of a daemon named {name!r} in /dev/shm{running_ones()}")
    for target in targets:
        removed = remove_leftovers(target)
        print(f"removed {len(removed)} objects of {target!r}: {' '.join(removed) or '-'}")
    return 0
