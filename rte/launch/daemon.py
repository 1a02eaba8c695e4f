"""A daemon started by another program: ``rte serve --name NAME ...`` as a child.

:class:`LaunchedDaemon` is the one way rte's own programs run a daemon of their
own (``rte demo``, ``rte play``, the supervisor's replicas, a Ray host, the
tests and the benchmarks), so each waits the same way, for the same thing:

- **start**: ``python -m rte serve --name NAME OPTIONS`` with this interpreter,
  stdin and stdout closed, its stderr appended to a file
  (:mod:`rte.launch.childlog`: a chatty child never blocks on a full pipe, and
  what it said can be read while it runs); or, with ``echo``, read from a pipe
  by a thread that hands each line on as it comes and keeps the last
  :data:`TAIL_LINES` (the supervisor's children, which run for months). With
  ``own_session`` the child leads a session of its own: a Ctrl-C at the
  terminal reaches the launcher alone, which then stops the daemon itself.
- **dies with its parent** (:mod:`rte.launch.parentdeath`): the kernel sends it
  SIGTERM when the launching thread ends, SIGKILL included; launch from a
  thread that lives as long as the process (the main thread).
- **ready**: its stderr line ``rte serve: ready ...`` (a single daemon's and a
  supervisor's alike) says clients may connect. :meth:`wait_ready` waits for
  it until a deadline, telling ``progress`` each second what it waits for and
  for how long; a child that exits first is EngineGone at once, with its exit
  code and last words (there is nothing to wait for).
- **connect**, sync or asyncio: once it is ready, :func:`rte.client.connect`
  without waiting.
- **stop**: SIGTERM (the daemon finalizes its sessions and unlinks its shared
  memory), SIGKILL after a grace period; what a daemon that did not exit
  cleanly left of its name is removed (never a live daemon's: the name's lock
  says whether one holds it). As a context manager it stops on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import IO

from rte.client import AsyncClient, EngineClient, connect, connect_async
from rte.errors import EngineGone, RequestTimeout
from rte.launch.childlog import child_log, last_line, said
from rte.launch.parentdeath import dies_with_this_process
from rte.protocol.names import DaemonNames
from shm.lock import NameLockHeld

START_TIMEOUT_S = 60.0  # a model may take a while to load
STOP_TIMEOUT_S = 30.0  # it finalizes every session first
PROGRESS_EVERY_S = 1.0
READY = "rte serve: ready "
CLEAN_EXITS = (0, -signal.SIGTERM)  # it unlinked its shared memory itself
TAIL_LINES = 200  # of an echoed child's stderr, kept for said()

Progress = Callable[[str, float], None]
"""Told, while a wait lasts, what it waits for and the seconds waited so far."""


def unique_name(prefix: str) -> str:
    """A daemon name of this process's own: ``PREFIX-PID-XXXXXX``."""
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def serve_command(name: str, options: Sequence[str] = ()) -> list[str]:
    """``python -m rte serve --name NAME OPTIONS`` with this interpreter."""
    return [sys.executable, "-m", "rte", "serve", "--name", name, *options]


class LaunchedDaemon:
    """``rte serve --name NAME OPTIONS`` in a child process of this one.

    Args:
        name: the daemon's name (:func:`unique_name` makes one of this process's own).
        options: what follows ``rte serve --name NAME`` (a later option wins).
        command: the whole command line instead, when the caller builds it
            (the supervisor's, with its own ``--log-level``); it serves ``name``.
        env: the child's whole environment (default: this process's).
        own_session: the child leads a session of its own (a terminal's Ctrl-C
            reaches the launcher alone).
        echo: told each line the child writes to stderr, as it comes (from a
            thread of its own); then only the last :data:`TAIL_LINES` are kept.
        die_with_parent: the kernel stops the child when the launching thread ends.
    """

    def __init__(
        self,
        name: str,
        options: Sequence[str] = (),
        *,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        own_session: bool = False,
        echo: Callable[[str], None] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self.name = name
        self.command = list(command) if command is not None else serve_command(name, options)
        # what it says: in a file (closed by stop() or kill()), or echoed with a tail kept
        self._log: IO[str] | None = child_log() if echo is None else None
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._said = ""  # all the log held, once it is closed
        self._ready: str | None = None
        self._echo: threading.Thread | None = None
        self._signalled = False
        try:
            self.process = subprocess.Popen(  # on the caller's thread: see die_with_parent
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE if self._log is None else self._log,
                env=None if env is None else dict(env),
                start_new_session=own_session,
                preexec_fn=dies_with_this_process() if die_with_parent else None,  # noqa: PLW1509 (prctl only: no lock taken)
            )
        except BaseException:
            self._close_log()
            raise
        if echo is not None:
            self._echo = threading.Thread(
                target=self._forward, args=(echo,), name=f"echo-{name}", daemon=True
            )
            self._echo.start()

    # -- what it says --------------------------------------------------------

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        """Whether the child has not exited yet."""
        return self.process.poll() is None

    def said(self) -> str:
        """All the child has written to stderr so far (an echoed child's last
        :data:`TAIL_LINES`), all of it once stopped."""
        if self._log is None:
            return "".join(f"{line}\n" for line in list(self._tail))
        if self._log.closed:
            return self._said
        return said(self._log)

    def last_words(self) -> str:
        """The last line the child wrote to stderr (``rte serve: `` dropped)."""
        if self._echo is not None and not self.running:
            self._echo.join(5)  # an exited child's last lines may still be on their way
        return last_line(self.said())

    def ready_line(self) -> str | None:
        """The child's ready line (``rte serve: `` dropped) once it has said it (it
        may have exited since); None before."""
        if self._ready is None:
            line = next((x for x in self.said().splitlines() if x.startswith(READY)), None)
            self._ready = None if line is None else line.removeprefix("rte serve: ")
        return self._ready

    def _forward(self, echo: Callable[[str], None]) -> None:
        """Each line of the child's stderr pipe to the tail, then to ``echo``."""
        stream = self.process.stderr
        assert stream is not None
        with stream:
            for raw in stream:
                text = raw.decode(errors="replace").rstrip("\n")
                if text:
                    self._tail.append(text)
                    echo(text)

    # -- waiting for it ------------------------------------------------------

    def wait_ready(self, timeout: float = START_TIMEOUT_S, progress: Progress | None = None) -> str:
        """Wait for the child's ready line; the line (``rte serve: `` dropped).

        Raises:
            EngineGone: the child exited before it was ready (its exit code and
                last words), at once.
            RequestTimeout: not ready in ``timeout`` s; the child still runs.
        """
        wait = _Wait(self, timeout, progress)
        while not wait.over():
            time.sleep(0.05)
        return wait.line

    async def wait_ready_async(
        self, timeout: float = START_TIMEOUT_S, progress: Progress | None = None
    ) -> str:
        """:meth:`wait_ready` for asyncio code (the loop runs while it waits)."""
        wait = _Wait(self, timeout, progress)
        while not wait.over():
            await asyncio.sleep(0.05)
        return wait.line

    def connect(
        self, timeout: float = START_TIMEOUT_S, progress: Progress | None = None
    ) -> EngineClient:
        """A client of the daemon, once it is ready (:meth:`wait_ready`'s errors)."""
        self.wait_ready(timeout, progress)
        return connect(self.name)

    async def connect_async(
        self, timeout: float = START_TIMEOUT_S, progress: Progress | None = None
    ) -> AsyncClient:
        """An asyncio client of the daemon, once it is ready."""
        await self.wait_ready_async(timeout, progress)
        return await connect_async(self.name)

    # -- stopping it ---------------------------------------------------------

    def signal_stop(self) -> None:
        """SIGTERM, once, if it runs: it finalizes its sessions and exits."""
        if self.running and not self._signalled:
            self._signalled = True
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                self.process.send_signal(signal.SIGTERM)

    def stop(self, grace: float = STOP_TIMEOUT_S, *, remove_leftovers: bool = True) -> int:
        """SIGTERM and wait; SIGKILL after ``grace`` s. Its exit code.

        With ``remove_leftovers``, what a daemon that did not exit cleanly (killed,
        crashed) left of its name is removed. Calling it again returns the same code.
        """
        self.signal_stop()
        try:
            code = self.process.wait(grace)
        except subprocess.TimeoutExpired:
            code = self.kill()
        self._close_log()
        if remove_leftovers and code not in CLEAN_EXITS:
            self.remove_leftovers()
        return code

    def kill(self) -> int:
        """SIGKILL and wait: it cleans up nothing (its leftovers stay). Its exit code."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        code = self.process.wait(10)
        self._close_log()
        return code

    def leftovers(self) -> list[str]:
        """What of this daemon's name is in /dev/shm now."""
        return DaemonNames(self.name).leftovers()

    def remove_leftovers(self) -> list[str]:
        """Unlink what a dead daemon of this name left; never a live one's (then: [])."""
        with contextlib.suppress(NameLockHeld):  # another daemon of the name owns them
            return DaemonNames(self.name).remove_leftovers()
        return []

    def _close_log(self) -> None:
        if self._echo is not None:
            self._echo.join(5)  # the pipe ends with the child
        if self._log is None or self._log.closed:
            return
        self._said = said(self._log)
        self._log.close()

    def __enter__(self) -> LaunchedDaemon:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else f"exit {self.process.returncode}"
        return f"LaunchedDaemon({self.name!r}, pid {self.pid}, {state})"


class _Wait:
    """One wait for a daemon's ready line: :meth:`over` checks, the caller sleeps."""

    def __init__(self, daemon: LaunchedDaemon, timeout: float, progress: Progress | None) -> None:
        self.daemon = daemon
        self.timeout = timeout
        self.progress = progress
        self.start = time.monotonic()
        self.next_progress = self.start + PROGRESS_EVERY_S
        self.line = ""

    def over(self) -> bool:
        """True once it is ready; raises once it cannot be (:meth:`LaunchedDaemon.wait_ready`)."""
        daemon = self.daemon
        code = daemon.process.poll()  # before the look: a ready line and then an exit is ready
        line = daemon.ready_line()
        if line is not None:
            self.line = line
            return True
        if code is not None:
            raise EngineGone(
                f"daemon {daemon.name!r} did not start (exit {code}): {daemon.last_words()}"
            )
        now = time.monotonic()
        if now - self.start >= self.timeout:
            raise RequestTimeout(
                f"daemon {daemon.name!r} (pid {daemon.pid}) was not ready in {self.timeout:g} s "
                f"and still runs; it last said: {daemon.last_words()}"
            )
        if self.progress is not None and now >= self.next_progress:
            what = f"daemon {daemon.name!r} (pid {daemon.pid}) to be ready"
            self.progress(what, now - self.start)
            self.next_progress += PROGRESS_EVERY_S
        return False
