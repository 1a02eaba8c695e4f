"""Checks that take a core for tens of seconds (mypy over the whole tree), started
in the background as soon as the suite is collected, so that they run beside
the tests (which use about half of a 2-core box: they wait on daemons and
browsers) instead of after them. The test that owns one waits for its result
and fails on it exactly as if it had run it then."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
# a test's node id (its tail) -> the command it checks
EARLY = {"test_quality.py::test_mypy_strict": (sys.executable, "-m", "mypy")}


@dataclass
class Done:
    command: tuple[str, ...]
    returncode: int
    output: str


class _Started:
    def __init__(self, command: tuple[str, ...]) -> None:
        self.command = command
        # (a file: a pipe nobody reads until the end could fill and stall it)
        self.out: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in done)
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=self.out, stderr=subprocess.STDOUT, text=True
        )

    def done(self, timeout: float) -> Done:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        self.out.seek(0)
        output = self.out.read()
        self.out.close()
        return Done(self.command, code, output)


_started: dict[str, _Started] = {}


def start(items: Sequence[Any]) -> None:
    """Start the early command of each collected test that has one."""
    for item in items:
        for tail, command in EARLY.items():
            if item.nodeid.endswith(tail) and tail not in _started:
                _started[tail] = _Started(command)


def result(tail: str, timeout: float) -> Done:
    """The early command of test ``tail``, waited for (started now if it was not)."""
    started = _started.pop(tail, None) or _Started(EARLY[tail])
    return started.done(timeout)


def stop() -> None:
    """Whatever was started and not waited for (a test deselected, a run cut short)."""
    for started in _started.values():
        started.process.kill()
        started.process.wait()
        started.out.close()
    _started.clear()
