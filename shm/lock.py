"""NameLock: a named lock that dies with its holder.

One process at a time may own a name (a daemon's, say): creating its objects,
replacing a dead owner's leftovers, serving. The lock is ``flock`` on a small
shared-memory object of that name, so the kernel releases it when the holder
exits, however it exits; there is nothing to recover after a crash. A second
claimant fails at once (never waits), so two starts of one name cannot both
proceed, and neither can remove what the other just made.

The object stays in ``/dev/shm`` while held; the holder unlinks it on release.
Unlinking races with a claimant that opened the old object just before:
after taking the lock, the claimant checks that the name still refers to the
object it locked, and tries again if not.
"""

from __future__ import annotations

import fcntl
import os

import posix_ipc

from shm.errors import SegmentError
from shm.names import unlink_segment


class NameLockHeld(SegmentError):
    """Another live process holds the lock of that name."""


class NameLock:
    """Hold the lock ``name`` (a POSIX shared-memory name) until :meth:`release`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._fd: int | None = None
        for _ in range(8):  # retried only while the name is being unlinked under us
            fd = _open(name)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise NameLockHeld(f"{name} is held by another live process") from None
            if _same_object(fd, name):
                self._fd = fd
                return
            os.close(fd)  # we locked an object that was unlinked meanwhile
        raise NameLockHeld(f"{name} kept changing while it was being locked")

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlink the name, then let go (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            unlink_segment(self.name)
            os.close(fd)

    def __enter__(self) -> NameLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _open(name: str) -> int:
    try:
        memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREAT, mode=0o600)
    except posix_ipc.PermissionsError:
        raise SegmentError(f"{name} belongs to another user; choose another name") from None
    fd: int = memory.fd  # ours to close: SharedMemory does not close it
    return fd


def _same_object(fd: int, name: str) -> bool:
    try:
        memory = posix_ipc.SharedMemory(name)
    except posix_ipc.ExistentialError:
        return False
    try:
        return os.fstat(memory.fd).st_ino == os.fstat(fd).st_ino
    finally:
        memory.close_fd()
