"""LoopWait: an asyncio client's waiting, on its transport's file descriptors.

A waiting task sleeps on the transport's descriptors (the daemon's FIFO for
this client slot, one per pool member, or an eventfd the in-process serve
thread writes) registered with ``loop.add_reader``, after announcing the sleep
by the ring's protocol (:meth:`~rte.client.transport.Transport.arm`), so the
engine wakes it only when it sleeps, with no thread and no polling between
wake-ups (a liveness check runs every :data:`CHECK_EVERY_S` s; a daemon that
dies closes its end of the FIFO, which wakes the loop at once).

Several tasks may wait on one client at once: one of them sleeps on the
descriptors and sorts what came, the others wait for its news (a future
resolved when it wakes). While it sleeps, chunks other tasks release go back
at once (``core.eager``): nobody else flushes then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rte.client.core import ClientCore
from rte.client.transport import Transport

CHECK_EVERY_S = 0.25  # a sleeping client checks its engine's liveness this often


class LoopWait:
    """The waits of one :class:`~rte.client.aio.AsyncClient`; see the module.

    Args:
        transport: the client's transport, whose descriptors are slept on.
        core: the client's core (its ``eager`` flag is set while one sleeps).
        pump: gives back what was released and sorts what arrived, at once.
        check_open: raises ClientClosedError once the client is closed.
    """

    def __init__(
        self,
        transport: Transport,
        core: ClientCore,
        pump: Callable[[], None],
        check_open: Callable[[], None],
    ) -> None:
        self.transport, self._core = transport, core
        self._pump, self._check_open = pump, check_open
        self._news: asyncio.Future[None] | None = None  # set while a task sleeps on the fds
        self._wake: asyncio.Future[None] | None = None  # what that task awaits
        self._closing = False

    async def until(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``ready()`` (sorting what arrives meanwhile) or ``timeout`` s pass."""
        self._check_open()
        if ready():
            return True
        self._pump()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not ready():
            left = deadline - loop.time()
            if left <= 0:
                return False
            if self._news is not None:  # another task sleeps on the descriptors
                await asyncio.wait([self._news], timeout=left)
                self._check_open()
                continue
            news = self._news = loop.create_future()
            try:
                await self._sleep(loop, min(left, CHECK_EVERY_S))
                self._check_open()
                self._pump()
            finally:
                self._news = None
                news.set_result(None)
        return True

    async def close(self) -> None:
        """Wake the sleeping task (if any) and wait until it has left the descriptors."""
        self._closing = True
        _resolve(self._wake)
        while self._news is not None:
            await asyncio.wait([self._news], timeout=1.0)

    async def _sleep(self, loop: asyncio.AbstractEventLoop, budget: float) -> None:
        """Sleep on the transport's descriptors (announced, so the engine rings them)
        for at most ``budget`` s; then check that the engine lives."""
        transport = self.transport
        fds = transport.wake_fds()  # first: the engine may ring once the sleep is announced
        if transport.arm():
            return
        wake = self._wake = loop.create_future()
        for fd in fds:
            loop.add_reader(fd, _resolve, wake)
        timer = loop.call_later(budget, _resolve, wake)
        self._core.eager = True  # other tasks' releases go back at once: nobody flushes now
        try:
            await wake
        finally:
            self._core.eager = False
            timer.cancel()
            for fd in fds:
                loop.remove_reader(fd)
            self._wake = None
            alive = transport.disarm()
        if not self._closing:
            transport.check_live(alive)


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
