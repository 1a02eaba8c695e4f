"""The daemon ``rte play`` launches when no ``--name`` is given: a child
``python -m rte serve``, waited for with the asyncio client, stopped with
SIGTERM at the end (killed, and its leftovers removed, if it will not go).

The child runs in a session of its own, so a Ctrl-C at the terminal reaches
``rte play`` alone, which detaches its tabs' sessions before it stops the
daemon; its stderr goes to a file, whose last line explains a failed start.
An ``rte play`` that dies any other way, SIGKILL included, stops it too: the
kernel sends it SIGTERM (:mod:`rte.ipc.parentdeath`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import IO

from rte.client import AsyncClient, connect_async
from rte.errors import EngineGone
from rte.ipc.childlog import child_log, last_words
from rte.ipc.parentdeath import dies_with_this_process
from rte.protocol.names import DaemonNames

START_TIMEOUT_S = 60.0  # a model may take a while to load
STOP_TIMEOUT_S = 30.0


class LaunchedDaemon:
    """``rte serve --name NAME --model MODEL --max-sessions N [--pace-hz HZ]``."""

    def __init__(
        self, model: str, max_sessions: int, pace_hz: float, device: str | None = None
    ) -> None:
        self.name = f"play-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        command = [sys.executable, "-m", "rte", "serve", "--name", self.name, "--model", model]
        command += ["--max-sessions", str(max_sessions), "--pace-hz", str(pace_hz)]
        command += ["--device", device] if device else []
        self._said: IO[str] = child_log()  # closed in stop
        self.process = subprocess.Popen(  # made on the main thread, which lives as we do
            command,
            stdin=subprocess.DEVNULL,
            stderr=self._said,
            start_new_session=True,
            preexec_fn=dies_with_this_process(),  # noqa: PLW1509 (prctl only: no lock taken)
        )

    async def connect(self) -> AsyncClient:
        """A client of the daemon once it is up; if it exits first, its own words."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                return await connect_async(self.name, timeout=0.25)
            except EngineGone:
                if self.process.poll() is not None:
                    raise EngineGone(
                        f"the daemon did not start (exit {self.process.returncode}): "
                        f"{self.last_words()}"
                    ) from None
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.05)

    def last_words(self) -> str:
        """The last line the daemon wrote to stderr."""
        if self._said.closed:
            return "(its output is closed)"
        return last_words(self._said)

    def stop(self) -> None:
        """SIGTERM and wait; kill it and remove its leftovers if it will not go."""
        process = self.process
        try:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        finally:
            self._said.close()
        if process.returncode not in (0, -signal.SIGTERM):  # died or killed: unlink what it left
            DaemonNames(self.name).remove_leftovers()
