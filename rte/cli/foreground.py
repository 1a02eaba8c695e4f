"""``rte serve``'s body for one daemon: it runs in this process, in the
foreground, and says what happens on stderr, as a command does.

:func:`rte.ipc.process.serve` is the daemon itself and prints nothing; this is
where its ready line, its refusals and its clean stop become the command's
lines (each ``rte serve: ...``, the ready one what a launcher waits for,
:mod:`rte.launch.daemon`) and its exit codes: 0 after a clean stop, 2 for a
name that is taken or a model that cannot load, 1 for shared memory that
cannot be made.
"""

from __future__ import annotations

import logging
import signal
import sys

from rte.errors import ConfigurationError, DaemonRunningError
from rte.ipc.process import serve
from rte.ipc.settings import Settings
from shm import ShmError


def run_from_command_line(settings: Settings) -> int:
    """``rte serve``'s body: exit 0 after a clean stop, 2 when the name is taken."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s rte serve %(levelname)s %(message)s"
    )
    try:
        serve(
            settings,
            ready=lambda line: print(f"rte serve: {line}", file=sys.stderr, flush=True),
            restore_signals=False,
        )
    except (DaemonRunningError, ConfigurationError) as exc:  # the name, the model
        print(f"rte serve: {exc}", file=sys.stderr)
        return 2
    except ShmError as exc:  # /dev/shm too small, another user's objects
        print(f"rte serve: {exc}", file=sys.stderr)
        return 1
    finally:  # all is undone: a late signal must not end the exit another way (Python
        for sig in (signal.SIGTERM, signal.SIGINT):  # resets its own handlers as it exits,
            signal.signal(sig, signal.SIG_IGN)  # but leaves an ignored signal ignored)
    print(f"rte serve: {settings.name} stopped; its shared memory is unlinked", file=sys.stderr)
    return 0
