"""One daemon per device, supervised: ``rte serve --name NAME --replicas N`` (or
``--devices 0,1,2,3``) runs ``NAME-0`` ... ``NAME-(N-1)``, each an ordinary
``rte serve`` child process (with ``--devices``, child i pinned to ``cuda:Di``).

Clients reach them one by one by name, or as one pool: ``connect("NAME")``
finds ``NAME-*`` (:class:`rte.client.PoolClient`). The supervisor forwards each
child's log lines, prefixed with its name; says ``ready`` once every child is,
its own pid first (the one to stop: a child killed alone is restarted);
restarts a child that dies after it was ready, with backoff (1 s, doubling to
30 s; back to 1 s once a child has lived a minute) and says so; gives up at
once, stopping the others, on a child that exits before it was ready (its
settings cannot hold: retrying would not help), with that child's exit code
and last words. SIGTERM or SIGINT stop every child (each finalizes its
sessions and unlinks its shared memory) and then the supervisor. A supervisor
that dies any other way, SIGKILL included, stops them too: each child gets
SIGTERM from the kernel when it does (:mod:`rte.launch.parentdeath`; children are
started, and restarted, from the main thread, which lives as long as it does).
Each child is a :class:`~rte.launch.LaunchedDaemon` whose lines are echoed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rte.ipc.signals import StopSignals
from rte.launch.daemon import LaunchedDaemon

log = logging.getLogger("rte.supervisor")
BACKOFF_S = (1.0, 30.0)  # first delay, most delay
STEADY_S = 60.0  # a child that lived this long restarts after the first delay again
STOP_TIMEOUT_S = 30.0  # each child's grace after SIGTERM


@dataclass
class Child:
    """One supervised daemon: ``command`` serves ``name``; :attr:`daemon` is its
    current run (a new one at each restart). ``say`` writes one whole line: each
    of the child's, prefixed with its name (the command decides where they go)."""

    name: str
    command: list[str]
    say: Callable[[str], None]
    daemon: LaunchedDaemon | None = None
    started: float = 0.0
    delay: float = BACKOFF_S[0]
    restart_at: float | None = None
    restarts: int = 0

    @property
    def process(self) -> subprocess.Popen[bytes]:
        assert self.daemon is not None, f"{self.name} was never started"
        return self.daemon.process

    def start(self) -> None:
        self.started = time.monotonic()
        # a child serves alone: RTE_REPLICAS or RTE_DEVICES inherited would make
        # every child a supervisor of its own, without end
        env = {k: v for k, v in os.environ.items() if k not in ("RTE_REPLICAS", "RTE_DEVICES")}
        self.daemon = LaunchedDaemon(self.name, command=self.command, env=env, echo=self._echo)

    def ready(self) -> bool:
        return self.daemon is not None and self.daemon.ready_line() is not None

    def _echo(self, text: str) -> None:
        """Each line the child says, prefixed, as one line (so the lines of the
        other children's threads go whole in between)."""
        self.say(f"[{self.name}] {text}")


def supervise(
    children: list[Child], ready: Callable[[str], None], say: Callable[[str], None]
) -> int:
    """Run ``children`` until SIGTERM/SIGINT; the exit code. ``ready`` is told the
    ready line once every child is ready, ``say`` the supervisor's other words
    (a child that could not start)."""
    stopping = threading.Event()
    with StopSignals(stopping):
        try:
            for child in children:
                child.start()
            code = _until_ready(children, stopping, say)
            if code is None:
                ready(ready_line(children))
                _watch(children, stopping)
                code = 0
            return code
        finally:
            _stop_all(children)


def ready_line(children: list[Child]) -> str:
    """The supervisor's own pid first (the one to signal: a child killed alone is
    restarted), then its children and theirs."""
    me, pids = os.getpid(), ",".join(str(c.process.pid) for c in children if c.daemon)
    return (
        f"ready pid={me} children={','.join(c.name for c in children)} child_pids={pids} "
        f"(to stop them all: kill {me}; a child killed alone is restarted)"
    )


def _until_ready(
    children: list[Child], stopping: threading.Event, say: Callable[[str], None]
) -> int | None:
    """None once every child is ready; else the code to exit with (a child that
    could not start, or a stop meanwhile)."""
    while not all(c.ready() for c in children):
        if stopping.is_set():
            return 0
        for child in children:
            code = child.process.poll()
            if code is not None and not child.ready():
                assert child.daemon is not None
                say(f"{child.name} did not start (exit {code}): {child.daemon.last_words()}")
                return code or 1
        stopping.wait(0.05)
    return None


def _watch(children: list[Child], stopping: threading.Event) -> None:
    """Restart children that die, with backoff, until a stop."""
    while not stopping.wait(0.2):
        now = time.monotonic()
        for child in children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restart_at = None
                    child.restarts += 1
                    child.start()
                continue
            code = child.process.poll()
            if code is None:
                continue
            assert child.daemon is not None
            child.daemon.stop()  # its log closed, what a killed one left removed
            if now - child.started >= STEADY_S:
                child.delay = BACKOFF_S[0]
            log.warning(
                "%s (pid %d) exited with %s; restarting in %gs",
                child.name,
                child.process.pid,
                code,
                child.delay,
            )
            child.restart_at = now + child.delay
            child.delay = min(2 * child.delay, BACKOFF_S[1])


def _stop_all(children: list[Child]) -> None:
    """SIGTERM to every child at once, then each waited for (killed if it will not go)."""
    running = [c.daemon for c in children if c.daemon is not None]
    for daemon in running:
        daemon.signal_stop()
    for daemon in running:
        daemon.stop(STOP_TIMEOUT_S)
