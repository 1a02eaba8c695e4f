"""Doorbell: a POSIX semaphore that wakes a sleeping ring consumer.

The sleeper flag lives in the ring's header, beside the records it guards; the
protocol is in C (``shm_ring_prepare_sleep`` and the tail of ``shm_ring_push``):
the consumer raises the flag, fences, and re-checks the ring before sleeping;
the producer publishes, fences, and posts only if it finds the flag raised
(clearing it, so one sleep gets one post). Neither side can miss the other, so
there are no lost wake-ups, and a producer whose consumer is awake pays no
system call. Its name comes from :func:`shm.names.shm_name`, like a segment's.
"""

from __future__ import annotations

from typing import Protocol

import posix_ipc

from shm.errors import SegmentError, SegmentExistsError, SegmentNotFoundError
from shm.names import unlink_semaphore


class Bell(Protocol):
    """What a ring needs of its doorbell: a :class:`Doorbell`, or a
    :class:`~shm.fifo.FifoBell` for a consumer on an event loop."""

    def ring(self) -> None: ...

    def wait(self, timeout: float) -> bool: ...


class Doorbell:
    """A named semaphore (mode 0600). The creator unlinks it."""

    def __init__(self, name: str, *, create: bool = False) -> None:
        self.name = name
        self.owner = create
        try:
            if create:
                self._sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=0o600, initial_value=0)
            else:
                self._sem = posix_ipc.Semaphore(name)
        except posix_ipc.ExistentialError:
            if create:
                raise SegmentExistsError(f"semaphore {name} already exists") from None
            raise SegmentNotFoundError(f"no semaphore {name}") from None
        except posix_ipc.PermissionsError:
            raise SegmentError(
                f"semaphore {name} belongs to another user (permission denied)"
            ) from None

    def ring(self) -> None:
        self._sem.release()

    def wait(self, timeout: float) -> bool:
        """Sleep until rung or ``timeout`` seconds pass; True when rung. False also
        when a signal to this thread cut the sleep short (posix_ipc raises on
        EINTR instead of going on): every caller looks again and sleeps again."""
        try:
            self._sem.acquire(max(timeout, 0.0))
        except (posix_ipc.BusyError, posix_ipc.SignalError):
            return False
        return True

    def close(self) -> None:
        self._sem.close()

    def unlink(self) -> None:
        """Remove the name (creator's duty); opened handles stay valid until closed."""
        unlink_semaphore(self.name)
