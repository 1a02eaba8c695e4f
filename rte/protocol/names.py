"""The names of one daemon's shared objects, derived here and nowhere else.

A daemon called NAME owns, for this user, a control segment (read-only for
clients), a claims segment (the one every client maps writable), a slab
segment, its doorbell, a checkpoint segment per generation (one that outlives
a crash), and per client slot a doorbell, a FIFO, a mailbox (that
client's rings and credits) and an input segment (its input slots): a client
maps its own slot's mailbox and input segment and no other's. They all live
under one POSIX name stem (``/rte.<uid>.NAME.``), so everything a daemon ever
created, or a crashed one left behind, is found by that stem (``shm.names`` maps names to
the files in ``/dev/shm``). After iceoryx2's ``ServiceName``: one value object,
never an f-string at the call site.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shm.lock import NameLock
from shm.names import objects, shm_name, unlink_objects

_DAEMON = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CONTROL = "ctl"


@dataclass(frozen=True)
class DaemonNames:
    """Every shared-object name of the daemon ``daemon``."""

    daemon: str

    def __post_init__(self) -> None:
        if not _DAEMON.match(self.daemon):
            raise ValueError(f"daemon name {self.daemon!r}: use 1-64 letters, digits, '_' or '-'")

    @property
    def stem(self) -> str:
        """The prefix every object of this daemon's name starts with."""
        return shm_name(self.daemon) + "."

    @property
    def control(self) -> str:
        return shm_name(self.daemon, _CONTROL)

    @property
    def slab(self) -> str:
        return shm_name(self.daemon, "slab")

    @property
    def figures(self) -> str:
        """Each session's real-time figures (:mod:`rte.ipc.figures`): written by the
        daemon alone, mapped read-only by everyone else."""
        return shm_name(self.daemon, "figures")

    @property
    def claims(self) -> str:
        """Where clients claim their slots (:mod:`rte.protocol.claims`): the one segment
        every client maps writable."""
        return shm_name(self.daemon, "claims")

    def mailbox(self, index: int) -> str:
        """The mailbox of client slot ``index``: its rings and credit block, mapped
        by that client and the daemon alone (:mod:`rte.protocol.mailbox`)."""
        return shm_name(self.daemon, f"m{index}")

    def client_inputs(self, index: int) -> str:
        """The input segment of client slot ``index``: the slab through which that
        client alone lends large inputs (:mod:`rte.ipc.inputs`)."""
        return shm_name(self.daemon, f"i{index}")

    @property
    def bell(self) -> str:
        """The daemon's doorbell: every client's inbox rings it."""
        return shm_name(self.daemon, "bell")

    @property
    def lock(self) -> str:
        """Held by the live daemon of this name (:class:`shm.lock.NameLock`)."""
        return shm_name(self.daemon, "lock")

    def client_bell(self, index: int) -> str:
        """The doorbell of client slot ``index``: the daemon rings it for its outbox."""
        return shm_name(self.daemon, f"c{index}")

    def client_wake(self, index: int) -> str:
        """The FIFO of client slot ``index``: rung instead of its doorbell for a
        client on an event loop (:class:`shm.fifo.FifoBell`)."""
        return shm_name(self.daemon, f"w{index}")

    def checkpoint(self, generation: int) -> str:
        """The checkpoint segment of this name's ``generation``-th daemon: its sessions'
        states every K chunks (:mod:`rte.ipc.checkpoints`), left behind by a crash."""
        return shm_name(self.daemon, f"k{generation}")

    def checkpoints(self) -> dict[int, str]:
        """The checkpoint segments of this name that exist now, by generation."""
        found = {}
        for name in objects(self.stem + "k"):
            tail = name[len(self.stem) + 1 :]
            if tail.isdigit():
                found[int(tail)] = name
        return dict(sorted(found.items()))

    def leftovers(self) -> list[str]:
        """The names of every object of this daemon that exists now."""
        return objects(self.stem)

    def remove_leftovers(self) -> list[str]:
        """Unlink every object a dead daemon of this name left; the names removed.

        Raises shm.lock.NameLockHeld (and removes nothing) while a live daemon
        holds the name.
        """
        with NameLock(self.lock):
            return self.unlink_unlocked(checkpoints=True)

    def unlink_unlocked(self, *, checkpoints: bool = False) -> list[str]:
        """Unlink every object of this name but its lock, for the lock's holder: and
        but its checkpoints unless ``checkpoints`` (a restarting daemon keeps a dead
        one's until its sessions are taken; ``rte clean`` removes them)."""
        keep = {self.lock, *([] if checkpoints else self.checkpoints().values())}
        return unlink_objects(self.stem, keep=keep)

    @classmethod
    def present(cls) -> list[DaemonNames]:
        """Every daemon of this user that has a control segment (alive or not)."""
        prefix, suffix = shm_name() + ".", "." + _CONTROL
        found = []
        for name in objects(prefix):
            daemon = name[len(prefix) : -len(suffix)]
            if name.endswith(suffix) and _DAEMON.match(daemon):
                found.append(cls(daemon))
        return sorted(found, key=lambda n: n.daemon)
