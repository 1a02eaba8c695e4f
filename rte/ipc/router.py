"""The router: who owns each session, and where each answer goes.

A session belongs to the client that attached it; no other client may act on
it, detach or reset it. The router checks that before a request reaches the
serve loop, and routes what the loop returns:

- a chunk, and any notice about an owned session, to the owner;
- a notice about a session nobody owns (a refused attach, an unknown session)
  to the client whose request produced it, which the core passes in: the
  requester is a value handed along, never an ambient "current request";
- a notice about the engine as a whole (session "") to every client.

Ownership is learnt from the outcomes themselves: ATTACHED binds a session to
its requester (with the credits its request asked for), DETACHED unbinds it
once delivered. Binding gives the session a handle in its client's credit
block, which the ATTACHED notice carries.
"""

from __future__ import annotations

from collections.abc import Iterable

from rte.contract import Notice, NoticeKind
from rte.credits import credit_refusal
from rte.ipc.clients import Connection
from rte.protocol.requests import Attach, Request


class Router:
    """Session ownership over the connections of one daemon."""

    def __init__(self, default_credits: int, quota: int = 1 << 62) -> None:
        """``quota``: the slots each client may hold (its sessions' credits must fit)."""
        self.owners: dict[str, Connection] = {}
        self.version = 0  # one more at each change of owners (what a cache of them checks)
        self.default_credits = default_credits
        self.quota = quota

    def owner(self, session: str) -> Connection | None:
        return self.owners.get(session)

    def refuse(self, requester: Connection, request: Request) -> str | None:
        """Why ``requester`` may not make ``request`` (None: it may)."""
        owner = self.owners.get(request.session)
        if owner is not None and owner is not requester:
            return f"PermissionError: session {request.session!r} belongs to another client"
        if isinstance(request, Attach) and owner is None:
            held = int(requester.credits.sum())  # (a free handle holds 0)
            fix = "start the daemon with a larger --quota (and --slab-slots)"
            refusal = credit_refusal(held, request.credits or self.default_credits, self.quota, fix)
            if refusal is not None:
                return f"RequestError: {refusal}"
        return None

    def route(
        self,
        notice: Notice,
        requester: Connection | None,
        everyone: Iterable[Connection],
        credits: int = 0,
    ) -> list[Connection]:
        """Where ``notice`` goes; updates ownership by what it says (``credits``:
        what the request that produced an ATTACHED asked for)."""
        owner = self.owners.get(notice.session)
        if notice.kind is NoticeKind.ATTACHED and requester is not None:
            if owner is None:
                self._bind(notice.session, requester, credits or self.default_credits)
            return [requester]
        if owner is not None:
            if notice.kind is NoticeKind.DETACHED:
                self._unbind(notice.session, owner)
            return [owner]
        if requester is not None:
            return [requester]
        return list(everyone) if not notice.session else []

    def release(self, session: str) -> None:
        """Forget who owns ``session`` (its client is gone; the engine kept it)."""
        owner = self.owners.get(session)
        if owner is not None:
            self._unbind(session, owner)

    def _bind(self, session: str, connection: Connection, credits: int) -> None:
        connection.bind(session, credits)
        self.owners[session] = connection
        self.version += 1

    def _unbind(self, session: str, connection: Connection) -> None:
        del self.owners[session]
        self.version += 1
        connection.unbind(session)
