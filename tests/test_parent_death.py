"""A daemon launched by another program dies with it, however it dies
(:mod:`rte.launch.parentdeath`): real processes, real SIGKILLs. The supervisor's
replicas are tested in ``test_supervisor.py``, ``rte play``'s daemon in
``test_play.py``; ``rte demo``'s and the helper itself here."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from daemon_harness import ended

from rte.ipc.inspect import summary
from rte.launch.parentdeath import dies_with
from rte.protocol.names import DaemonNames

ROOT = Path(__file__).resolve().parents[1]


def until_ended(pid: int, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not ended(pid):
        assert time.monotonic() < deadline, f"{what}: pid {pid} still runs after {seconds} s"
        time.sleep(0.05)


def line_of(process: subprocess.Popen[bytes], pattern: str, seconds: float = 60) -> re.Match[str]:
    """The first line ``process`` writes to stdout that matches ``pattern``."""
    assert process.stdout is not None
    deadline, out = time.monotonic() + seconds, b""
    while not (found := re.search(pattern, out.decode(errors="replace"))):
        left = deadline - time.monotonic()
        assert left > 0, f"no {pattern!r} in {seconds} s: {out!r}"
        if select.select([process.stdout], [], [], left)[0]:
            chunk = os.read(process.stdout.fileno(), 4096)
            assert chunk, f"it exited ({process.wait(5)}) without {pattern!r}: {out!r}"
            out += chunk
    return found


def reap(process: subprocess.Popen[bytes], started: int) -> None:
    """SIGKILL ``process`` and wait for it, close its stdout, and SIGKILL what it
    started (pid ``started``, unless 0) if that runs on: it must not outlive us."""
    process.kill()
    process.wait(10)
    assert process.stdout is not None
    process.stdout.close()
    if started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(started, signal.SIGKILL)


def test_a_sigkilled_demo_s_daemon_stops_and_unlinks_everything() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "rte", "demo", "--model", "reference", "--seconds", "600"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    name, daemon = "", 0
    try:
        name = line_of(demo, r"rte demo: daemon '([^']+)'").group(1)
        daemon = summary(name)["pid"]
        line_of(demo, r"chunks/s in all")  # streaming
        demo.kill()  # SIGKILL: no finally of its runs
        demo.wait(10)
        until_ended(daemon, 20, "the daemon of a killed rte demo")
        deadline = time.monotonic() + 10
        while left := DaemonNames(name).leftovers():
            assert time.monotonic() < deadline, f"the daemon of a killed rte demo left {left}"
            time.sleep(0.05)
    finally:
        reap(demo, daemon)
        if daemon:
            until_ended(daemon, 10, "a daemon SIGKILLed")
        if name:
            DaemonNames(name).remove_leftovers()


LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys, time
    from rte.launch.parentdeath import dies_with_this_process
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        preexec_fn=dies_with_this_process(),
    )
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


def test_a_launched_child_gets_sigterm_when_its_launcher_is_sigkilled() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, cwd=ROOT)
    child = 0
    try:
        child = int(line_of(launcher, r"(\d+)\n", 30).group(1))
        launcher.kill()
        launcher.wait(10)
        until_ended(child, 10, "the child of a SIGKILLed launcher")
    finally:
        reap(launcher, child)


def test_a_child_whose_launcher_is_already_gone_does_not_start() -> None:
    """The launcher died between the fork and the prctl (here: the pid it names is
    not the child's parent): no signal will ever come, so the child never runs."""
    tie = dies_with(os.getpid() + 1_000_000)  # no parent of ours has that pid
    assert tie is not None
    with pytest.raises(subprocess.SubprocessError, match="preexec_fn"):
        command = [sys.executable, "-c", "print('ran')"]
        subprocess.run(command, check=False, preexec_fn=tie, timeout=30)
