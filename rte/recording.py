"""A session's trace as it happens: the lines a recorder writes, in the order they land.

:class:`Recording` is one session's trace (:mod:`rte.trace`) being written: the
recorders of :mod:`rte.recorder` hand it the attach, each action sent and each
chunk handed out. An action waits until a chunk's receipt (``applied``) reaches
its seq; its line is then written just before that chunk's (refused: at once,
with the engine's words; never landed: at the end). A chunk whose index is not
past the trace's last is of another life of the session (before a reset) and
is not written; ``from_zero`` skips a reset's leftovers until the new life's
chunk 0. Each line is flushed as it is written, so a trace cut short by a crash
is whole up to its last line; a line that cannot be written (a full disk) stops
the trace, logged, and never the stream it records.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from rte.overload import DEFAULT_PRIORITY
from rte.trace import TraceWriter, chunk_hash, encode_value

log = logging.getLogger("rte.recorder")


class Recording:
    """The trace of one session as it happens: what a :class:`Recorder` calls on the
    way through. Acts wait until a chunk's receipt shows where they applied.
    ``from_zero``: chunks before one of index 0 are not this trace's (a reset's
    leftovers of the life before)."""

    def __init__(self, writer: TraceWriter, header: dict[str, Any], from_zero: bool = False):
        self.writer, self.header = writer, header
        self.session: str | None = None
        self._t0 = 0.0
        self._waiting: list[tuple[int, dict[str, Any], float]] = []  # (seq, encoded, t)
        self.conditioning: dict[str, Any] = {}  # encoded, as the engine keeps it: acts merged
        self.chunks = 0
        self.last = -1  # the last chunk's index
        self.from_zero = from_zero
        self.credits, self.priority = 0, DEFAULT_PRIORITY
        self.done = False
        self.error: str | None = None  # why it stopped early, if it did

    def now(self) -> float:
        return round(time.monotonic() - self._t0, 6)

    def attached(
        self, session: str, conditioning: Mapping[str, Any], credits: int, priority: int
    ) -> None:
        self.session, self._t0 = session, time.monotonic()
        self.credits, self.priority = credits, priority
        encoded = encode_value(dict(conditioning))
        self.conditioning = dict(encoded)
        self._write(self.header)
        self._write(
            {
                "kind": "attach",
                "session": session,
                "conditioning": encoded,
                "credits": credits,
                "priority": priority,
                "seeds": {"session": session},
            }
        )

    def acted(self, seq: int, encoded: Any) -> None:
        """Action ``seq`` was sent, its conditioning ``encoded`` (:func:`encode_value`)."""
        self._waiting.append((seq, encoded, self.now()))
        self.conditioning.update(encoded)

    def refused(self, seq: int, message: str) -> None:
        for i, (s, encoded, t) in enumerate(self._waiting):
            if s == seq:
                del self._waiting[i]
                self._act(s, encoded, t, None, message)
                return

    def passes_over(self, applied: int) -> bool:
        """Whether a chunk of receipt ``applied`` would land an act other than
        ``applied`` itself: one merged into it, or one refused (its notice unread)."""
        return any(seq < applied for seq, _, _ in self._waiting)

    def chunk(self, index: int, latent: np.ndarray[Any, Any], applied: int) -> None:
        if self.from_zero and index != 0:
            return
        if index <= self.last:  # of another life of the session (before a reset)
            return
        self.from_zero, self.last = False, index
        landed = [w for w in self._waiting if w[0] <= applied]
        if landed:
            self._waiting = [w for w in self._waiting if w[0] > applied]
            for seq, encoded, t in landed:
                self._act(seq, encoded, t, index)
        digest = chunk_hash(latent)
        record = {"kind": "chunk", "index": index, "blake2b": digest, "applied": applied}
        self._write({**record, "t": self.now()})
        self.chunks += 1

    def _act(
        self, seq: int, encoded: Any, t: float, chunk: int | None, refused: str | None = None
    ) -> None:
        record: dict[str, Any] = {
            "kind": "act",
            "seq": seq,
            "chunk": chunk,
            "conditioning": encoded,
        }
        record["t"] = t
        if refused is not None:
            record["refused"] = refused
        self._write(record)

    def _write(self, record: Mapping[str, Any]) -> None:
        """One line; a line that cannot be written (the disk, a value) stops the trace."""
        if self.error is not None:
            return
        try:
            self.writer.write(record)
        except (OSError, ValueError, RecursionError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("the trace of %r stopped: %s", self.session, self.error)
            with contextlib.suppress(OSError, ValueError):
                self.writer.close()

    def end(self) -> None:
        if self.done:
            return
        self.done = True
        if self.session is not None:
            for seq, encoded, t in self._waiting:  # applied at no chunk it took
                self._act(seq, encoded, t, None)
            self._write({"kind": "end", "chunks": self.chunks, "seconds": self.now()})
        if self.error is None:
            with contextlib.suppress(OSError, ValueError):
                self.writer.close()
