"""What a command waits for, said on stderr while it waits (a daemon coming up).

A :class:`Waiting` is a :data:`rte.launch.Progress`: told each second what is
waited for and for how long. On a terminal it is one line, rewritten in place
and erased when the wait ends, so a command that got what it waited for shows
only its own output. Elsewhere (a log, a pipe) it says nothing for a wait
shorter than :data:`QUIET_S`, then a line every :data:`QUIET_S`: a quick start
leaves a log as it was, a slow one says why nothing happens.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TextIO

QUIET_S = 10.0
ERASE = "\r\033[K"  # back to the line's start, and clear it


class Waiting:
    """``COMMAND: waiting for WHAT: N s`` on ``stream`` (default: stderr)."""

    def __init__(self, command: str, stream: TextIO | None = None) -> None:
        self.command = command
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = self.stream.isatty()
        self._shown = False  # a line on the terminal to erase
        self._said_at = 0.0  # the wait's seconds at the last line off a terminal

    def __call__(self, what: str, elapsed: float) -> None:
        line = f"{self.command}: waiting for {what}: {elapsed:.0f} s"
        if self.terminal:
            self.stream.write(f"{ERASE}{line}")
            self._shown = True
        elif elapsed - self._said_at >= QUIET_S:
            self.stream.write(f"{line}\n")
            self._said_at = elapsed
        self.stream.flush()

    def done(self) -> None:
        """Erase the terminal's line (a wait that is over leaves nothing there)."""
        if self._shown:
            self.stream.write(ERASE)
            self.stream.flush()
            self._shown = False

    def __enter__(self) -> Waiting:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.done()
