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
SIGTERM from the kernel when it does (:mod:`rte.ipc.parentdeath`; children are
started, and restarted, from the main thread, which lives as long as it does).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rte.ipc.parentdeath import dies_with_this_process
from rte.ipc.signals import StopSignals
from rte.protocol.names import DaemonNames

log = logging.getLogger("rte.supervisor")
BACKOFF_S = (1.0, 30.0)  # first delay, most delay
STEADY_S = 60.0  # a child that lived this long restarts after the first delay again
STOP_TIMEOUT_S = 30.0


@dataclass
class Child:
    name: str
    command: list[str]
    process: subprocess.Popen[str] | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    last_words: str = ""
    started: float = 0.0
    delay: float = BACKOFF_S[0]
    restart_at: float | None = None
    restarts: int = 0

    def start(self) -> None:
        self.ready.clear()
        self.started = time.monotonic()
        # a child serves alone: RTE_REPLICAS or RTE_DEVICES inherited would make
        # every child a supervisor of its own, without end
        env = {k: v for k, v in os.environ.items() if k not in ("RTE_REPLICAS", "RTE_DEVICES")}
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=dies_with_this_process(),  # noqa: PLW1509 (prctl only: no lock taken)
        )
        threading.Thread(target=self._forward, name=f"log-{self.name}", daemon=True).start()

    def _forward(self) -> None:
        """Each line the child says, prefixed; its ready line sets :attr:`ready`."""
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            text = line.rstrip("\n")
            if text:
                self.last_words = text
                # one write per line: the log lines of the other threads go whole in between
                sys.stderr.write(f"[{self.name}] {text}\n")
                sys.stderr.flush()
            if text.startswith("rte serve: ready "):
                self.ready.set()


def supervise(children: list[Child], ready: Callable[[str], None]) -> int:
    """Run ``children`` until SIGTERM/SIGINT; the exit code."""
    stopping = threading.Event()
    with StopSignals(stopping):
        try:
            for child in children:
                child.start()
            code = _until_ready(children, stopping)
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
    me, pids = os.getpid(), ",".join(str(c.process.pid) for c in children if c.process)
    return (
        f"ready pid={me} children={','.join(c.name for c in children)} child_pids={pids} "
        f"(to stop them all: kill {me}; a child killed alone is restarted)"
    )


def _until_ready(children: list[Child], stopping: threading.Event) -> int | None:
    """None once every child is ready; else the code to exit with (a child that
    could not start, or a stop meanwhile)."""
    while not all(c.ready.is_set() for c in children):
        if stopping.is_set():
            return 0
        for child in children:
            assert child.process is not None
            code = child.process.poll()
            if code is not None and not child.ready.is_set():
                time.sleep(0.1)  # its last words are still on their way
                print(
                    f"rte serve: {child.name} did not start (exit {code}): {child.last_words}",
                    file=sys.stderr,
                )
                return code or 1
        stopping.wait(0.05)
    return None


def _watch(children: list[Child], stopping: threading.Event) -> None:
    """Restart children that die, with backoff, until a stop."""
    while not stopping.wait(0.2):
        now = time.monotonic()
        for child in children:
            assert child.process is not None
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restart_at = None
                    child.restarts += 1
                    child.start()
                continue
            code = child.process.poll()
            if code is None:
                continue
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
    running = [c for c in children if c.process and c.process.poll() is None]
    for child in running:
        assert child.process is not None
        child.process.send_signal(signal.SIGTERM)
    for child in running:
        assert child.process is not None
        try:
            child.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait(10)
            DaemonNames(child.name).remove_leftovers()
