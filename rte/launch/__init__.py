"""Running a daemon from another program: start it, wait for it, stop it.

- :mod:`~rte.launch.daemon` — :class:`LaunchedDaemon`: ``rte serve`` as a child
  process, waited for with a progress line, connected to (sync or asyncio), its
  last words when it fails, stopped (SIGTERM, then SIGKILL) and its leftovers
  removed; what ``rte demo``, ``rte play``, the supervisor, a Ray host, the
  tests and the benchmarks all use.
- :mod:`~rte.launch.supervisor` — ``rte serve --replicas N``: N launched
  daemons, each restarted with backoff when it dies.
- :mod:`~rte.launch.childlog` — a child's stderr in a file its parent may read
  while it runs.
- :mod:`~rte.launch.parentdeath` — a child that ends when its launcher dies,
  however it dies.

The daemon itself (its process, its loop) is :mod:`rte.ipc`; this package only
imports the client, to connect to what it started.
"""

from __future__ import annotations

from rte.launch.daemon import (
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    LaunchedDaemon,
    Progress,
    serve_command,
    unique_name,
)

__all__ = [
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "LaunchedDaemon",
    "Progress",
    "serve_command",
    "unique_name",
]
