"""Start and stop real daemons (``python -m rte serve``) for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rte.client import Client, connect
from rte.daemon import remove_leftovers


class DaemonProcess:
    def __init__(self, name: str, *args: str) -> None:
        self.name = name
        command = [sys.executable, "-m", "rte", "serve", "--name", name, *args]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.stderr = ""

    def client(self, timeout: float = 30.0) -> Client:
        if self.process.poll() is not None:
            _, err = self.process.communicate(timeout=5)
            raise AssertionError(f"daemon exited with {self.process.returncode}: {err}")
        return connect(self.name, timeout=timeout)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait; returns the exit code (kills it if it will not go)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            _, self.stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, self.stderr = self.process.communicate(timeout=10)
        return self.process.returncode

    def kill(self) -> None:
        self.process.kill()
        self.process.communicate(timeout=10)


def leftovers(name: str) -> list[str]:
    return [p.name for p in Path("/dev/shm").glob(f"*rte.{os.getuid()}.{name}.*")]


def wait_for(predicate, timeout: float = 10.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def cleanup(name: str) -> None:
    remove_leftovers(name)
