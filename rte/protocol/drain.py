"""The daemon-wide drain: the request that starts it, and the daemon's report.

``rte drain NAME`` (:mod:`rte.cli.drain`) connects to daemon NAME as a client
and sends :class:`Drain` (a DRAIN record of :mod:`rte.protocol.wire`: like BYE a
word to the daemon itself, not a request of its serve loop). From then on the
daemon is draining (:mod:`rte.ipc.draining`): it refuses every new attach
(REJECTED, saying so: a pool places it on another member), tells each client
once, with a DRAINING notice per session, that its session is to move, and
publishes in its control block since when it drains and how many sessions it
still holds (:meth:`rte.protocol.control.Control.draining_since_ns`,
:meth:`~rte.protocol.control.Control.held`). A daemon never stops draining:
a restarted one starts afresh.

The daemon answers every DRAIN (the first starts the drain; a later one only
asks) with a DRAINING notice for session ``""`` whose message is a
:class:`DrainReport` as JSON: a machine's answer, like EXPORTED's byte count.
It names the sessions still there and their clients, as many as fit in
``budget`` bytes (``held`` counts them all).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rte.errors import WireError

LISTED_BYTES = 2048  # a report names sessions up to about this many bytes of JSON


@dataclass(frozen=True)
class Drain:
    """Start draining the daemon (or, draining already, ask how far it is)."""

    seq: int = 0


@dataclass(frozen=True)
class Held:
    """A session still on a draining daemon: its client's slot and pid (-1 and 0:
    its client left, the daemon is detaching it); ``moving``: its client exported
    it a moment ago, and it may yet come back (its move refused everywhere)."""

    session: str
    client: int
    pid: int
    moving: bool = False

    def __str__(self) -> str:
        if self.client < 0:
            return f"{self.session!r} (its client left: being detached)"
        if self.moving:
            return f"{self.session!r} (being moved by client {self.client}, pid {self.pid})"
        return f"{self.session!r} (client {self.client}, pid {self.pid})"


@dataclass(frozen=True)
class DrainReport:
    """A draining daemon's answer to DRAIN.

    Attributes:
        already: it was draining before this request.
        since_s: how long it has been draining.
        held: how many sessions it holds (attached, parked or being detached).
        sessions: the first of them, as many as fit the message.
    """

    already: bool
    since_s: float
    held: int
    sessions: tuple[Held, ...]

    def to_message(self, budget: int = LISTED_BYTES) -> str:
        """The report as a notice's message: JSON, naming sessions while they fit."""
        listed: list[list[object]] = []
        used = 0
        for h in self.sessions:
            entry: list[object] = [h.session, h.client, h.pid, *([1] if h.moving else [])]
            used += len(json.dumps(entry)) + 1
            if used > budget:
                break
            listed.append(entry)
        raw = {"already": self.already, "since_s": self.since_s, "held": self.held}
        return json.dumps(raw | {"sessions": listed})

    @classmethod
    def from_message(cls, text: str) -> DrainReport:
        """A report from its message; WireError for a message that is not one."""
        try:
            raw = json.loads(text)
            sessions = tuple(
                Held(str(s), int(c), int(p), bool(moving and moving[0]))
                for s, c, p, *moving in raw["sessions"]
            )
            return cls(bool(raw["already"]), float(raw["since_s"]), int(raw["held"]), sessions)
        except (ValueError, KeyError, TypeError) as exc:
            raise WireError(f"a DRAINING answer that is not a drain report: {text!r:.80}") from exc

    def listing(self) -> str:
        """The sessions still there, for people ("'a' (client 0, pid 12), ...")."""
        shown = ", ".join(map(str, self.sessions))
        more = self.held - len(self.sessions)
        return shown + (f" and {more} more" if more > 0 else "")
