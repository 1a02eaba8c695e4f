"""A child process's stderr in a file that its parent may read while it runs.

The child inherits the file's open description, offset included: a parent
that seeks to the start and reads moves where the child's next write lands,
and that write then overwrites what the child wrote before. Opened for
appending, every write of the child goes to the end whatever the offset, so
the parent may read at any time.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from typing import IO


def child_log() -> IO[str]:
    """An unnamed file for ``Popen(..., stderr=child_log())``, opened to append."""
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (the caller closes it)
    # (mode "a+" would not do: on a descriptor already open it only seeks to the end)
    flags = fcntl.fcntl(log.fileno(), fcntl.F_GETFL)
    fcntl.fcntl(log.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)
    return log


def said(log: IO[str]) -> str:
    """All the child wrote to ``log`` so far."""
    log.seek(0)
    return log.read()


def last_words(log: IO[str], prefix: str = "rte serve: ") -> str:
    """The last line the child wrote (``prefix`` dropped), for a one-line error."""
    return last_line(said(log), prefix)


def last_line(text: str, prefix: str = "rte serve: ") -> str:
    """The last line of ``text`` (``prefix`` dropped); ``(it said nothing)`` if none."""
    lines = text.strip().splitlines() or ["(it said nothing)"]
    return lines[-1].removeprefix(prefix)
