"""Traces of ``rte play``'s sessions: each tab's, for ``rte replay`` to make again.

``rte play --record-traces DIR`` (``Gateway(traces=DIR)`` when embedded) has
the gateway talk to its daemon through an :class:`~rte.recorder.AsyncRecorder`
of its client rather than the client itself, whose files are a
:class:`TraceFiles`: each tab's session is recorded (:mod:`rte.trace`: its
attach, every action with the chunk it applied at, every chunk's hash) into
``DIR/SESSION.trace.jsonl``, and after a Reset its next life into
``SESSION-2.trace.jsonl``, and so on. The name is not the video's sidecar's
(``--record``'s ``SESSION.jsonl``), so both may share a directory.

A trace never replaces another file: a name taken already (an earlier run's
trace in the same directory, or two sessions whose names map to one file
name) gets the next free ``NAME.K.trace.jsonl``; a session name too long for
a file name is cut and given a hash of the whole.

A trace ends, with its end line, when its tab closes (its session detaches)
and when the gateway closes: ``rte play`` stopped by SIGTERM or Ctrl-C, or its
daemon's death. Every line is flushed as it happens, so a trace is whole up to
its last line even after a SIGKILL. The gateway's reader task hands the
recorder each batch before it copies the frames out (the hash is of the
daemon's own bytes), and the recording never stops the stream: a trace that
cannot be written stops alone, logged.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from rte.client import AsyncClient
from rte.errors import ConfigurationError
from rte.recorder import AsyncRecorder

Link = AsyncClient | AsyncRecorder  # what the gateway talks to its daemon through
SUFFIX = ".trace.jsonl"
NAME_BYTES = 160  # a file name's part from the session (the file system allows 255)


class TraceFiles:
    """Where each session's trace goes: ``DIRECTORY/SESSION.trace.jsonl``, then
    ``SESSION-2.trace.jsonl`` for its next life (after a reset); never a file
    that exists already (see the module)."""

    def __init__(self, directory: Path) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"--record-traces {directory}: cannot make it: {exc}"
            ) from None
        self.directory = directory
        self._lives: dict[str, int] = {}

    def __call__(self, session: str) -> Path:
        """A new, empty file for ``session``'s next trace (OSError if none can be made)."""
        lives = self._lives[session] = self._lives.get(session, 0) + 1
        name = _file_name(session if lives == 1 else f"{session}-{lives}")
        for again in range(1, 1000):
            path = self.directory / f"{name}{'' if again == 1 else f'.{again}'}{SUFFIX}"
            try:
                path.open("x").close()  # taken by nobody else: made now, empty
            except FileExistsError:
                continue
            return path
        raise FileExistsError(f"{self.directory}: 999 traces of {name!r} there already")


def _file_name(name: str) -> str:
    """``name`` as one file name's part: UTF-8, no '/' or NUL, no leading '.', not
    too long."""
    plain = name.encode(errors="replace").decode().replace("/", "_").replace("\0", "_")
    if plain.startswith("."):
        plain = f"_{plain}"
    if len(plain.encode()) > NAME_BYTES:
        digest = hashlib.blake2b(name.encode(errors="surrogatepass"), digest_size=6).hexdigest()
        plain = plain.encode()[: NAME_BYTES - 13].decode(errors="ignore") + f"-{digest}"
    return plain


def link_of(client: AsyncClient, traces: Path | None, device: str | None = None) -> Link:
    """The client itself (``traces`` None), or a recorder of it writing to ``traces``;
    ``device`` goes into each trace's header when the caller knows it."""
    if traces is None:
        return client
    return AsyncRecorder(client, TraceFiles(traces), device=device)


def end_traces(link: Link, session: str | None = None) -> None:
    """End ``session``'s trace (None: every one) if ``link`` records any."""
    if isinstance(link, AsyncRecorder):
        if session is None:
            link.close()
        else:
            link.end(session)
