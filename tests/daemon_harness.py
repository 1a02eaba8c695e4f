"""Start and stop real daemons (``python -m rte serve``) for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rte.client import Client, connect


class DaemonProcess:
    def __init__(self, name: str, *args: str) -> None:
        self.name = name
        command = [sys.executable, "-m", "rte", "serve", "--name", name, *args]
        # stderr to a file, not a pipe: a chatty daemon must never block on a full pipe
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (lives as long as we do)
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self._log)
        self.stderr = ""

    def client(self, timeout: float = 30.0) -> Client:
        if self.process.poll() is not None:
            raise AssertionError(f"daemon exited with {self.process.returncode}: {self._read()}")
        return connect(self.name, timeout=timeout)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait; returns the exit code (kills it if it will not go)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.stderr = self._read()
        self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)
        self.stderr = self._read()
        self._log.close()

    def _read(self) -> str:
        if self._log.closed:
            return self.stderr
        self._log.seek(0)
        return self._log.read()


def leftovers(name: str) -> list[str]:
    return [p.name for p in Path("/dev/shm").glob(f"*rte.{os.getuid()}.{name}.*")]


def wait_for(
    predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
