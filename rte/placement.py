"""Placement: which member (a daemon, a Ray host, a child engine) gets a session.

One policy, written once, used wherever sessions are spread over members:
the pool of daemons (:class:`rte.client.pool.PoolClient`), the Ray router
(:class:`rte.ray.hosting.Router`) and the children of one engine
(:class:`rte.replica.ReplicaEngine`).

The policy, in three rules:

1. **Sticky.** A session stays on the member it was admitted to until it is
   released or its member is lost; asking again names that member only.
2. **Room and liveness.** Only a live member with a free row is a candidate.
3. **Least loaded.** Candidates come most free rows first, then fewest of this
   caller's (owner's) sessions, then in the order given. The caller tries them
   in that order: a member may still refuse (full meanwhile, or its real-time
   capacity), and the next one is asked.

``pack=True`` reverses rule 3's first key (fewest free rows with room first):
for members that share one thread, the children of one ReplicaEngine, where a
session joining a busy child costs nothing and waking an idle one costs a
whole extra step each tick. Members on separate devices spread.

:func:`ranked` is the pure ordering; :class:`Placement` adds the sticky table
(session -> member, with each session's owner), from which it counts each
caller's load itself. Nothing here waits, locks or talks to a member: the
callers measure free rows and liveness, and hold their own lock if shared.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Member(Generic[K]):
    """What placement knows of one member when a session is to be placed.

    Attributes:
        key: the member's name (a daemon name, a host index, a child engine).
        free_rows: rows no session holds on it now.
        mine: sessions this caller (owner) has on it already.
        live: whether it can take sessions at all.
    """

    key: K
    free_rows: int
    mine: int = 0
    live: bool = True


def ranked(members: Iterable[Member[K]], *, pack: bool = False) -> list[K]:
    """The keys of the members that may take the next session, best first.

    Args:
        members: every member, in the order ties keep.
        pack: fullest member with room first (members sharing one thread).

    Returns:
        The live members with a free row: most free rows first (fewest with
        ``pack``), then fewest of this caller's sessions, then as given.
    """
    room = [m for m in members if m.live and m.free_rows > 0]
    sign = 1 if pack else -1
    room.sort(key=lambda m: (sign * m.free_rows, m.mine))  # stable: ties as given
    return [m.key for m in room]


class Placement(Mapping[str, K]):
    """The sticky table: each placed session's member (read as a mapping).

    ``placement[session]`` is its member; :meth:`choices` orders the members
    for a new session (or names its member again); :meth:`settle` records where
    it was admitted, :meth:`release` forgets it, :meth:`lose` forgets a member.
    """

    def __init__(self, *, pack: bool = False) -> None:
        self.pack = pack
        self._home: dict[str, K] = {}
        self._owner: dict[str, str] = {}

    def __getitem__(self, session: str) -> K:
        return self._home[session]

    def __iter__(self) -> Iterator[str]:
        return iter(self._home)

    def __len__(self) -> int:
        return len(self._home)

    def __repr__(self) -> str:
        return repr(dict(self))

    def owner_of(self, session: str) -> str:
        """The owner ``session`` was settled for ("" when none was named)."""
        return self._owner[session]

    def load(self, key: K, owner: str = "") -> int:
        """Sessions of ``owner`` on member ``key``."""
        return sum(1 for s, k in self._home.items() if k == key and self._owner[s] == owner)

    def choices(
        self,
        session: str,
        free_rows: Mapping[K, int],
        *,
        owner: str = "",
        live: Callable[[K], bool] | None = None,
    ) -> list[K]:
        """The members to try for ``session``, best first.

        Args:
            session: the session to place.
            free_rows: each member's free rows, in the order ties keep.
            owner: whose session it is (its load on each member breaks ties).
            live: whether a member can take sessions (all of ``free_rows`` if None).

        Returns:
            Its member alone when it is placed already (sticky, whatever its
            room); else :func:`ranked` over ``free_rows``; empty when none has room.
        """
        if session in self._home:
            return [self._home[session]]
        members = [
            Member(key, rows, self.load(key, owner), live is None or live(key))
            for key, rows in free_rows.items()
        ]
        return ranked(members, pack=self.pack)

    def settle(self, session: str, key: K, owner: str = "") -> None:
        """Record that ``session`` (of ``owner``) was admitted to member ``key``."""
        self._home[session] = key
        self._owner[session] = owner

    def release(self, session: str) -> K | None:
        """Forget ``session``; the member it was on (None if it was not placed)."""
        self._owner.pop(session, None)
        return self._home.pop(session, None)

    def lose(self, key: K) -> list[tuple[str, str]]:
        """Forget member ``key``'s sessions (it died); each as (session, owner)."""
        lost = [(s, self._owner[s]) for s, k in self._home.items() if k == key]
        for session, _ in lost:
            self.release(session)
        return lost
