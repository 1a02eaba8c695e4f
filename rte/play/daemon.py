"""The daemon ``rte play`` launches when no ``--name`` is given: ``rte serve``
with the page's rows, pace and device, as a :class:`~rte.launch.LaunchedDaemon`.

It runs in a session of its own, so a Ctrl-C at the terminal reaches ``rte
play`` alone, which detaches its tabs' sessions before it stops the daemon; a
failed start is said in the daemon's own last words. An ``rte play`` that dies
any other way, SIGKILL included, stops it too (:mod:`rte.launch.parentdeath`):
launch it from the main thread.
"""

from __future__ import annotations

from rte.cli.progress import Waiting
from rte.client import AsyncClient
from rte.launch import LaunchedDaemon, unique_name


def launch(
    model: str, max_sessions: int, pace_hz: float, device: str | None = None
) -> LaunchedDaemon:
    """``rte serve --name play-PID-XXXXXX --model MODEL --max-sessions N --pace-hz HZ
    [--device DEVICE]``, started now."""
    options = ["--model", model, "--max-sessions", str(max_sessions), "--pace-hz", str(pace_hz)]
    options += ["--device", device] if device else []
    return LaunchedDaemon(unique_name("play"), options, own_session=True)


async def connected(daemon: LaunchedDaemon) -> AsyncClient:
    """A client of ``daemon`` once it is ready, the wait said on stderr meanwhile
    (:class:`rte.cli.progress.Waiting`); if it exits first, its own last words."""
    with Waiting("rte play") as progress:
        return await daemon.connect_async(progress=progress)
