"""Members: a pool's daemons, connected, and one wait over them all.

Each member is a :class:`~rte.client.shm.ShmTransport` woken through its slot's
FIFO (``wake="fd"``), so one wait covers every daemon: a sleep is announced on
each member's outbox ring, then all their descriptors are polled at once (a
blocking caller, :meth:`Members.sleep`) or watched by an event loop
(:meth:`Members.wake_fds`, :meth:`Members.arm`, :meth:`Members.disarm`). A
member whose daemon is found dead while waking is closed and named to the
caller (the pool), which decides what its sessions become.

A daemon down when the pool is made (a supervisor restarting it) is
``missing``, not fatal; :meth:`Members.rejoin` tries those again, at once.
"""

from __future__ import annotations

import contextlib
import select

from rte.client.shm import ShmTransport
from rte.contract import Manifest
from rte.errors import EngineGone, RteError


class Members:
    """The daemons ``names`` of one pool (``timeout`` as for each connect).

    Attributes:
        by_name: each daemon's transport, in the order given (closed once lost).
        missing: daemons down when last tried.
        manifest: the first one's (every member makes chunks of its shape and dtype).
    """

    def __init__(self, names: list[str], timeout: float | None) -> None:
        if not names:
            raise ValueError("a pool needs at least one daemon")
        self.by_name: dict[str, ShmTransport] = {}
        self.missing: list[str] = []
        gone: list[str] = []
        try:
            for name in names:
                try:
                    self.by_name[name] = ShmTransport(name, timeout=timeout, wake="fd")
                except EngineGone as exc:  # down (restarting, say): the pool goes on without
                    self.missing.append(name)
                    gone.append(str(exc))
        except BaseException:
            self.close()
            raise
        if not self.by_name:
            raise EngineGone(f"no daemon of the pool is up: {'; '.join(gone)}")
        first = next(iter(self.by_name))
        self.manifest: Manifest = self.by_name[first].manifest
        shape, dtype = self.manifest.latent_shape, self.manifest.latent_dtype
        for name, member in self.by_name.items():
            m = member.manifest
            if (m.latent_shape, m.latent_dtype) != (shape, dtype):
                self.close()
                raise RteError(
                    f"daemon {name!r} makes {m.latent_dtype}{m.latent_shape} chunks, "
                    f"{first!r} {dtype}{shape}: not one pool"
                )
        self._armed: list[str] = []  # members whose sleep is announced

    def live(self) -> list[str]:
        return [n for n, m in self.by_name.items() if not m.closed]

    def free_rows(self, name: str) -> int:
        """Rows of daemon ``name`` no client's session holds (its table says)."""
        return self.by_name[name].free_rows()

    def rejoin(self) -> None:
        """Try the daemons that were down again (at once: no waiting)."""
        for name in list(self.missing):
            try:
                self.by_name[name] = ShmTransport(name, timeout=0.0, wake="fd")
            except RteError:
                continue
            self.missing.remove(name)

    # -- one wait over all ----------------------------------------------------

    def ready(self) -> bool:
        """Whether a live member has a record waiting."""
        return any(m.ready() for m in self.by_name.values() if not m.closed)

    def sleep(self, budget: float) -> list[str]:
        """Announce a sleep on every live member and poll all their descriptors,
        for at most ``budget`` s; the members found dead on waking."""
        fds = self.wake_fds()
        if self.arm():
            return []
        try:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            poller.poll(budget * 1000)
        finally:
            dead = self.disarm()
        return dead

    def wake_fds(self) -> list[int]:
        return [fd for name in self.live() for fd in self.by_name[name].wake_fds()]

    def arm(self) -> bool:
        """Announce a sleep on every live member; True (none announced) when one has news."""
        for name in self.live():
            if self.by_name[name].arm():
                self.disarm()
                return True
            self._armed.append(name)
        return False

    def disarm(self) -> list[str]:
        """End the sleep on every member it was announced on; the ones found dead
        (closed here: the caller says what their sessions become)."""
        armed, self._armed = self._armed, []
        dead = []
        for name in armed:
            member = self.by_name[name]
            alive = member.disarm()
            try:
                member.check_live(alive)
            except EngineGone:
                dead.append(name)
        return dead

    def close(self) -> None:
        for member in self.by_name.values():
            with contextlib.suppress(Exception):
                member.close()
