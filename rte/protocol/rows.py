"""A daemon's rows as its roster shows them: how many sessions hold one, how many are free.

The daemon publishes each client's session count in its roster
(:class:`~rte.protocol.claims.Roster`, in the control segment, written by the
daemon alone); anyone who maps the control segment reads the daemon's rows
from it without asking the daemon anything. This is the one reading of it:
the pool and the Ray router place a session on the daemon with the most free
rows, ``rte inspect`` shows the sessions held. Only ACTIVE clients count: a
client being removed (CLOSING) or revoked holds no session any more.
"""

from __future__ import annotations

from rte.protocol.claims import ClientEntry, ClientState, Roster


def held_rows(entries: list[ClientEntry]) -> int:
    """The sessions ``entries`` (a roster's) hold: one row each."""
    active = ClientState.ACTIVE
    return sum(e.sessions for e in entries if e.state is active)


def free_rows(roster: Roster, max_sessions: int) -> int:
    """Rows of a daemon of ``max_sessions`` rows that no client's session holds."""
    return max_sessions - held_rows(roster.entries())
