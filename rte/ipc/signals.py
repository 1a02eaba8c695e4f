"""SIGTERM and SIGINT as a request to stop, safe whenever they come.

A Python signal handler runs in the main thread between two bytecodes: also
while the main thread holds a lock, and also inside the handler itself when
signals come in a burst (a parent that dies with ``PR_SET_PDEATHSIG`` set
sends one per thread of it as they end). A handler that takes a lock
(``threading.Event.set`` does) can then wait for itself for ever: a daemon
once hung so, with its shared memory, after its Ray actor's node died. So the
handler here only writes a byte to a pipe; a thread of its own reads it and
does the rest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """While entered, SIGTERM and SIGINT set ``stopping`` and then call ``then``
    (on a thread of this object's). On exit the previous handlers come back, or,
    with ``restore`` False, both signals are ignored from then on (a process
    about to exit: a late signal must not end it another way). Enter it on the
    main thread."""

    def __init__(
        self,
        stopping: threading.Event,
        then: Callable[[], None] = lambda: None,
        *,
        restore: bool = True,
    ) -> None:
        self.stopping = stopping
        self.then = then
        self.restore = restore
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        self._read, self._write = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self._write, False)
        self._thread = threading.Thread(target=self._relay, name="rte-signals", daemon=True)
        self._thread.start()
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for sig in SIGNALS:  # first: no handler writes to the pipe once it is closed
            signal.signal(sig, self._previous[sig] if self.restore else signal.SIG_IGN)
        os.close(self._write)  # the relay reads the end of the pipe and returns
        self._thread.join()
        os.close(self._read)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # a system call, no lock: safe inside anything, itself included (a pipe full
        # of signals already says it all)
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, bytes((signum,)))

    def _relay(self) -> None:
        while os.read(self._read, 64):
            if not self.stopping.is_set():
                self.stopping.set()
                self.then()
