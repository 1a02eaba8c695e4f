"""The relay's window: how far a relayed session runs ahead of its caller.

A session's credits bound the chunks its daemon has emitted and not had
released. A caller on another node releases a round trip later (the stream's
way to it, the release call's way back: a millisecond or more on Ray), so a
session held to its credits alone makes ``credits`` chunks per round trip and
each waits a round trip for the next. The :class:`~rte.ray.relay.Relay`
copies a step's chunks into its message before the stream sends it, so it may
give a row back to the daemon at once: that chunk is then *ahead*, counted
against its session's window here until the caller releases it. A session
with ``window`` chunks ahead has its next rows held as any client's are (given
back when the caller releases them); when the caller releases a chunk that
was ahead, the oldest held row of that session is given back in its place and
is ahead from then on.

So credits still hold end to end: a caller that stops reading stalls its own
sessions after ``credits + window`` chunks, and neither the host nor the
object store grows past that. A window of 0 lends nothing ahead (every row
waits for its caller's release). A release the relay did not hand out (a row
of no step it sent, or one released twice) changes nothing.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np

from rte.client.batch import ChunkBatch

WINDOW = 0  # chunks a relayed session may run ahead of its caller, beyond its credits

GiveBack = Callable[[ChunkBatch, "np.ndarray[Any, Any]"], None]


def check_window(window: int) -> None:
    """ValueError unless ``window`` is a whole number of chunks, 0 or more."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be a whole number of chunks, 0 or more, not {window!r}")


class Sent:
    """One relayed step's rows still out at the caller, by position: ``held`` (their
    daemon rows not given back yet) and ``ahead`` (given back when sent)."""

    __slots__ = ("ahead", "batch", "held", "sessions")

    def __init__(self, batch: ChunkBatch, sessions: list[str]) -> None:
        self.batch, self.sessions = batch, sessions
        self.held: set[int] = set()
        self.ahead: set[int] = set()


class Window:
    """The rows a relay has sent its caller, and which of them it gave back early.

    ``give_back(batch, rows)`` gives rows back to the daemon (the relay's
    transport's); ``window``: chunks each session may have ahead."""

    def __init__(self, give_back: GiveBack, window: int = WINDOW) -> None:
        check_window(window)
        self.window = window
        self._give_back = give_back
        self.sent: dict[int, Sent] = {}  # ident -> its rows still out
        self.ahead: dict[str, int] = {}  # session -> its chunks ahead (absent: none)
        self._waiting: dict[str, collections.deque[tuple[int, int]]] = {}  # held, oldest first

    def sent_step(self, ident: int, batch: ChunkBatch) -> None:
        """Step ``ident`` (``batch``) is copied into its message: the rows of sessions
        with room in their window are given back now, the rest held."""
        sessions = list(batch.sessions)
        out = self.sent[ident] = Sent(batch, sessions)
        ahead, window, early = self.ahead, self.window, []
        if not window:  # nothing goes ahead: each row waits for its own release
            out.held.update(range(len(sessions)))
            return
        for position, session in enumerate(sessions):
            count = ahead.get(session, 0)
            if count < window:
                ahead[session] = count + 1
                early.append(position)
            else:
                out.held.add(position)
                self._waiting.setdefault(session, collections.deque()).append((ident, position))
        out.ahead.update(early)
        if early:
            self._give_back(batch, np.array(early, np.int64))

    def released(self, ident: int, rows: Any) -> None:
        """The caller released ``rows`` of step ``ident``."""
        out = self.sent.get(ident)
        if out is None:
            return
        back, freed = [], []
        for position in np.asarray(rows, np.int64).ravel().tolist():
            if position in out.held:
                out.held.discard(position)
                self._unwait(out.sessions[position], ident, position)
                back.append(position)
            elif position in out.ahead:
                out.ahead.discard(position)
                freed.append(out.sessions[position])
        if back:
            self._give_back(out.batch, np.array(back, np.int64))
        if not out.held and not out.ahead:
            del self.sent[ident]
        for session in freed:
            self._returned(session)

    def clear(self) -> None:
        self.sent.clear()
        self.ahead.clear()
        self._waiting.clear()

    def _returned(self, session: str) -> None:
        """A chunk of ``session`` that was ahead is released: its oldest held row
        (if any) is given back in its place, and is ahead from now on."""
        waiting = self._waiting.get(session)
        if waiting:
            ident, position = waiting.popleft()
            if not waiting:
                del self._waiting[session]
            out = self.sent[ident]
            out.held.discard(position)
            out.ahead.add(position)
            self._give_back(out.batch, np.array([position], np.int64))
            return
        count = self.ahead.get(session, 0) - 1
        if count > 0:
            self.ahead[session] = count
        else:
            self.ahead.pop(session, None)

    def _unwait(self, session: str, ident: int, position: int) -> None:
        waiting = self._waiting.get(session)
        if waiting is not None:
            waiting.remove((ident, position))
            if not waiting:
                del self._waiting[session]
