"""FifoBell: a doorbell an event loop can wait on, a named FIFO beside the segments.

A :class:`~shm.doorbell.Doorbell` (a POSIX semaphore) wakes a thread that
blocks in ``sem_wait``; an asyncio loop cannot wait on one without a thread.
A FifoBell is the same bell as a file descriptor: the producer writes a byte,
the consumer's loop sees its fd readable (``loop.add_reader``) and drains it.
The sleeper protocol is the ring's, unchanged (``Ring.prepare_sleep``: the
producer rings only a consumer that announced its sleep), so a consumer that is
awake costs its producer nothing and a ring never costs a byte per record.

The creator (the daemon) opens the FIFO for reading *and* writing: its writes
never fail for want of a reader, and a full pipe means a wake-up is pending
already (the write is dropped). A consumer opens it read-only; when every
writer is gone (the daemon exited or died) its fd reads end-of-file, so a
loop waiting on it learns of the death at once, not at its next check.

It lives in :data:`shm.names.SHM_DIR` under a :func:`~shm.names.shm_name`, so
the listing and removal of a daemon's leftovers find it like a segment.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat

from shm.errors import SegmentError, SegmentExistsError, SegmentNotFoundError
from shm.names import SHM_DIR, unlink_segment

_DRAIN = 4096


class FifoBell:
    """A named FIFO (mode 0600). The creator unlinks it.

    Args:
        name: a POSIX name from :func:`shm.names.shm_name`.
        create: make it (the producer); else open an existing one to wait on.
    """

    def __init__(self, name: str, *, create: bool = False) -> None:
        self.name = name
        self.owner = create
        path = SHM_DIR / name.lstrip("/")
        try:
            if create:
                os.mkfifo(path, 0o600)
                self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            else:
                self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileExistsError:
            raise SegmentExistsError(f"FIFO {name} already exists") from None
        except FileNotFoundError:
            raise SegmentNotFoundError(f"no FIFO {name}") from None
        except PermissionError:
            raise SegmentError(f"FIFO {name} belongs to another user (permission denied)") from None
        info = os.fstat(self._fd)
        if not stat.S_ISFIFO(info.st_mode) or info.st_uid != os.getuid():
            os.close(self._fd)
            raise SegmentError(f"{path} is not a FIFO of this user")

    def fileno(self) -> int:
        return self._fd

    def ring(self) -> None:
        """Wake the consumer (a byte; dropped when the pipe is full: a wake is pending)."""
        with contextlib.suppress(BlockingIOError):
            os.write(self._fd, b"\x01")

    def drain(self) -> bool:
        """Take every pending wake-up; False when no writer is left (the producer is gone)."""
        while True:
            try:
                data = os.read(self._fd, _DRAIN)
            except BlockingIOError:
                return True
            if not data:
                return False
            if len(data) < _DRAIN:
                return True

    def wait(self, timeout: float) -> bool:
        """Sleep until rung (or the producer is gone) or ``timeout`` s pass; True when rung."""
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        woke = bool(poller.poll(max(timeout, 0.0) * 1000))
        if woke:
            self.drain()
        return woke

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def unlink(self) -> None:
        """Remove the name (creator's duty); open descriptors stay valid until closed."""
        unlink_segment(self.name)
