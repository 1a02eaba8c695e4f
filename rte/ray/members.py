"""Members: the hosts of one :class:`~rte.ray.transport.RayTransport`, one member each.

A host's member is opened at its first use and kept until the host is lost:

- **on this caller's node**: a :class:`~rte.client.shm.ShmTransport` of that
  daemon, by name, as any local client (its chunks read in place, its wake-ups
  a FIFO);
- **on another node**: a :class:`~rte.ray.remote.RemoteMember`, fed by its host's
  pushes, its requests and releases actor calls not waited on.

A lost host is set aside in :attr:`Members.gone` with why, and every wake-up
here (ready, flush, the event-loop fds, arm and disarm) skips it. What the loss
means for sessions is the transport's: :meth:`Members.disarm` only reports the
members it found gone, so that the transport loses them.
"""

from __future__ import annotations

import contextlib
from typing import Any

from rte.client.shm import ShmTransport
from rte.errors import EngineGone
from rte.ray.remote import RemoteMember
from rte.ray.window import WINDOW

PLACE_TIMEOUT_S = 30.0

Member = ShmTransport | RemoteMember


class Members:
    """The members of ``hosts`` (at ``places``), opened at their first use; see the module."""

    def __init__(
        self,
        ray: Any,
        hosts: list[Any],
        places: list[tuple[str, str]],
        node: str,
        owner: str,
        window: int = WINDOW,
    ) -> None:
        self.ray, self.hosts, self.places, self.node, self.owner = ray, hosts, places, node, owner
        self.window = window  # (a remote member's: rte.ray.window)
        self.open: dict[int, Member] = {}
        self.gone: dict[int, str] = {}  # host -> why it is lost

    def local(self, index: int) -> bool:
        """Whether host ``index``'s daemon is on this caller's node."""
        return self.places[index][1] == self.node

    def get(self, index: int) -> Member:
        """Host ``index``'s member, opened now if this is its first use.

        Raises:
            EngineGone: the host is lost.
        """
        if index in self.gone:
            raise EngineGone(self.gone[index])
        member = self.open.get(index)
        if member is None:
            daemon = self.places[index][0]
            if self.local(index):
                member = ShmTransport(daemon, timeout=PLACE_TIMEOUT_S, wake="fd")
            else:
                member = RemoteMember(self.ray, self.hosts[index], daemon, self.owner, self.window)
            self.open[index] = member
        return member

    def live(self) -> list[tuple[int, Member]]:
        """The open members whose hosts are not lost, with their indexes."""
        return [(i, m) for i, m in list(self.open.items()) if i not in self.gone]

    def lose(self, index: int, why: str) -> bool:
        """Set host ``index`` aside (its member closed); False if it already was."""
        if index in self.gone:
            return False
        self.gone[index] = why
        member = self.open.get(index)
        if member is not None:
            with contextlib.suppress(Exception):
                member.close()
        return True

    def all_gone(self) -> bool:
        return len(self.gone) == len(self.hosts)

    def ready(self) -> bool:
        return any(m.ready() for _, m in self.live())

    def flush(self, *, force: bool = True) -> None:
        """Send what the remote members have gathered (releases; not ``force``:
        only a member's that has gathered enough, see :meth:`RemoteMember.flush`)."""
        for member in self.open.values():
            if isinstance(member, RemoteMember):
                member.flush(force=force)

    # -- waiting on an event loop -------------------------------------------

    def wake_fds(self) -> list[int]:
        fds = []
        for _, member in self.live():
            fds += member.wake_fds() if isinstance(member, ShmTransport) else [member.wake_fd()]
        return fds

    def arm(self) -> bool:
        """Arm each local member; True (the armed ones disarmed again) if one has work."""
        for index, member in self.live():
            if isinstance(member, ShmTransport) and member.arm():
                self._disarm_until(index)
                return True
        return False

    def _disarm_until(self, stop: int) -> None:
        for index, member in self.live():
            if index == stop:
                return
            if isinstance(member, ShmTransport):
                member.disarm()

    def disarm(self) -> list[tuple[int, str]]:
        """Disarm (or drain) every member; the local ones found gone, with why."""
        found_gone = []
        for index, member in self.live():
            if isinstance(member, RemoteMember):
                member.drain()
                continue
            alive = member.disarm()
            try:
                member.check_live(alive)
            except EngineGone as exc:
                found_gone.append((index, f"EngineGone: {exc}"))
        return found_gone

    def close(self) -> None:
        for member in self.open.values():
            with contextlib.suppress(Exception):
                member.close()
