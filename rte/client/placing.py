"""Placing a pool's attach: which daemon gets it, and the next when one refuses.

An attach is placed explicitly, by its own record (:class:`Placing`): the
pool's live daemons in order of most free rows (then fewest of this pool's
sessions, :class:`rte.placement.Placement`); it goes to the first, and a daemon
that refuses it (full meanwhile, or dead before it answered) passes it to the
next, so the caller sees one answer: the first daemon's ATTACHED, or one
REJECTED that names every daemon's refusal. A draining daemon (``rte drain``:
its control block says so) is tried last: it refuses every new session, and
its refusal, like any, passes the attach on. A session being moved
(:mod:`rte.client.migration`) goes only where it is pinned.

:class:`Placer` owns the attaches in flight; the pool
(:class:`rte.client.pool.PoolTransport`) hands it each daemon's REJECTED and
each daemon's death, and it tells the pool when a daemon it tried is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rte.client.members import Members
from rte.contract import Notice, NoticeKind
from rte.errors import AdmissionError, EngineGone, RteError
from rte.placement import Placement
from rte.protocol.requests import Attach


@dataclass
class Placing:
    """An attach in flight: the request as the caller made it (its arrays not yet
    lent), the daemons still to try, where it went, and who refused it."""

    request: Attach
    order: list[str]
    member: str = ""
    refused: list[str] = field(default_factory=list)


class Placer:
    """The attaches of pool ``name`` in flight over its ``daemons``; see the module.

    Args:
        name: the pool's name, for messages.
        daemons: the pool's daemons.
        home: session -> the daemon it lives on (sticky), shared with the pool.
        pinned: session -> the daemons it may go to (a move), shared with the pool.
        lose: called with a daemon found gone while trying it.
    """

    def __init__(
        self,
        name: str,
        daemons: Members,
        home: Placement[str],
        pinned: dict[str, list[str]],
        lose: Callable[[str], None],
    ) -> None:
        self.name, self.daemons, self.home, self.pinned = name, daemons, home, pinned
        self._lose = lose
        self._placing: dict[int, Placing] = {}  # seq of an attach in flight -> its placing

    def place(self, request: Attach, room_s: float) -> None:
        """Send ``request`` to the first daemon of its order that takes it.

        Raises:
            EngineGone: every daemon of the pool is gone.
            AdmissionError: none took it (each refusal named).
        """
        self.daemons.rejoin()
        if not self.daemons.live():
            raise EngineGone(f"every daemon of pool {self.name!r} is gone")
        placing = Placing(request, self.order(request.session))
        if not self.try_next(placing, room_s):
            if not self.daemons.live():
                raise EngineGone(f"every daemon of pool {self.name!r} is gone")
            raise AdmissionError(self.refusal(placing))

    def order(self, session: str) -> list[str]:
        """Its daemon when it is attached already (the daemon says so); else the
        live ones by :mod:`rte.placement` (most free rows, then fewest of this
        pool's sessions), then those whose roster shows no room: it may lag a
        detach, and their own refusal is the one to trust; the draining ones last."""
        live = self.daemons.live()
        if session in self.pinned:  # moving: only where it is sent (rte.client.migration)
            return [name for name in self.pinned[session] if name in live]
        free = {name: self.daemons.free_rows(name) for name in live}
        order = self.home.choices(session, free)
        if session in self.home:
            return order
        order += [name for name in free if name not in order]
        draining = [name for name in order if self.draining(name)]
        return [name for name in order if name not in draining] + draining

    def draining(self, name: str) -> bool:
        """Whether daemon ``name`` drains (``rte drain``: it takes no new session)."""
        return self.daemons.by_name[name].control.draining_since_ns != 0

    def try_next(self, placing: Placing, room_s: float, *, quiet: bool = False) -> bool:
        """Send the attach to the next daemon of its order that takes the request;
        False when none is left. ``quiet``: a daemon that cannot take it (ring
        full, no input slot) counts as a refusal, not an error to the caller."""
        while placing.order:
            name = placing.order.pop(0)
            member = self.daemons.by_name[name]
            if member.closed:
                continue
            try:
                lent = member.lend(placing.request, room_s)
                try:
                    member.send(lent, room_s)
                except BaseException:
                    member.unlend(lent)
                    raise
            except EngineGone:
                self._lose(name)
                continue
            except RteError as exc:
                if not quiet:
                    raise
                placing.refused.append(f"{name}: {exc}")
                continue
            placing.member = name
            self._placing[placing.request.seq] = placing
            return True
        return False

    def take(self, seq: int) -> Placing | None:
        """The attach in flight numbered ``seq`` (no longer in flight), or None."""
        return self._placing.pop(seq, None) if seq else None

    def rejected(self, name: str, placing: Placing, item: Notice) -> Notice | None:
        """Daemon ``name`` refused ``placing`` with ``item``: tried on the next
        daemon (None: that one answers), else the REJECTED naming every refusal."""
        placing.refused.append(f"{name}: {item.message}")
        if self.try_next(placing, 0.0, quiet=True):
            return None
        return Notice(item.session, NoticeKind.REJECTED, self.refusal(placing), item.seq)

    def died(self, name: str, hand_out: Callable[[Notice], None]) -> None:
        """Daemon ``name`` died: each attach in flight to it goes on to the next
        daemon, or its REJECTED goes to ``hand_out``."""
        for seq, placing in list(self._placing.items()):
            if placing.member == name:
                del self._placing[seq]
                placing.refused.append(f"{name}: it died")
                if not self.try_next(placing, 0.0, quiet=True):
                    why_not = self.refusal(placing)
                    session = placing.request.session
                    hand_out(Notice(session, NoticeKind.REJECTED, why_not, seq))

    @staticmethod
    def refusal(placing: Placing) -> str:
        refused = placing.refused
        return "no daemon of the pool took it" + (f" ({'; '.join(refused)})" if refused else "")
