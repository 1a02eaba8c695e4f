"""Ctrl-C as a terminal sends it: SIGINT to the whole foreground process group,
the command and every child it started there, through a pseudo-terminal.

A test that signals one pid misses what a user sees: a daemon the command
launched in its group gets the signal too, stops first, and the command fails
on its way out. Each command here runs as the leader of a process group of its
own on a pty (``start_new_session``), and the test signals that group
(``os.killpg``), as the terminal driver does on ^C.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess, Deadline

from shm.names import objects, shm_name

DEMO_STEM = "demo-"


class Terminal:
    """``python -m rte ARGS`` on a pty, as the foreground process group of its own
    session; what it writes (stdout and stderr, as a terminal shows them) kept."""

    def __init__(self, *args: str) -> None:
        master, slave = os.openpty()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rte", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
        os.close(slave)
        self._master = master
        self.text = ""

    def read_until(self, done: Callable[[str], bool], seconds: float = 60.0) -> None:
        """Read what it writes until ``done(text)`` or it closes the terminal."""
        limit = Deadline(seconds, "the command's output")
        while not done(self.text):
            limit.check(self.text)
            ready, _, _ = select.select([self._master], [], [], 0.05)
            if not ready:
                continue
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not chunk:
                return
            self.text += chunk.decode(errors="replace").replace("\r\n", "\n")

    def ctrl_c(self) -> None:
        """SIGINT to the whole process group, as the terminal sends it."""
        os.killpg(self.process.pid, signal.SIGINT)

    def finish(self, seconds: float = 60.0) -> int:
        """Read to the end; its exit code."""
        self.read_until(lambda _: False, seconds)
        code = self.process.wait(timeout=seconds)
        os.close(self._master)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def test_ctrl_c_at_the_terminal_ends_the_demo_with_its_summary_and_cleans_up() -> None:
    for _ in range(2):  # it failed 7 times in 10: twice in a row is no accident
        demo = Terminal("demo", "--seconds", "60")
        try:
            demo.read_until(lambda text: "chunks/s in all\n" in text)
            demo.ctrl_c()
            code = demo.finish()
        finally:
            demo.kill()
        assert code == 130, demo.text  # the convention: interrupted, after its summary
        assert "Traceback" not in demo.text
        assert "latency p50 ms" in demo.text and "session-3" in demo.text, demo.text
        assert "daemon stopped; left in /dev/shm: nothing" in demo.text, demo.text
        assert "rte demo: interrupted; the summary above is of what came before" in demo.text
        assert "stopping" not in demo.text, demo.text  # its daemon did not stop under it
        assert objects(shm_name(f"{DEMO_STEM}{demo.process.pid}-")) == []


def importing_numpy(pid: int) -> bool:
    """Whether process ``pid`` has started to load NumPy (the longest import of a
    command): past the interpreter's own start, in rte's imports."""
    try:
        return "numpy" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # it ended
        return True


@pytest.mark.parametrize("attempt", range(3))
def test_ctrl_c_while_a_command_is_still_importing_is_one_line(attempt: int) -> None:
    command = Terminal("inspect", "--json")
    try:
        limit = Deadline(30, "the command's start")
        while not importing_numpy(command.process.pid):
            limit.check()
            time.sleep(0.001)
        command.ctrl_c()
        code = command.finish()
    finally:
        command.kill()
    assert "Traceback" not in command.text, command.text
    assert code in (0, 130), (code, command.text)  # done, or interrupted in one line
    if code == 130:
        assert command.text.strip().endswith("interrupted"), command.text


def test_ctrl_c_ends_inspect_watch_with_exit_0(shm_prefix: str) -> None:
    daemon = DaemonProcess(shm_prefix, "--model", "null")
    try:
        daemon.client().close()  # up
        watch = Terminal("inspect", shm_prefix, "--watch", "--interval", "0.2")
        try:
            watch.read_until(lambda text: f"daemon {shm_prefix}" in text)
            watch.ctrl_c()
            code = watch.finish()
        finally:
            watch.kill()
        assert code == 0, watch.text
        assert "Traceback" not in watch.text
        assert daemon.process.poll() is None  # another session's daemon: not signalled
    finally:
        assert daemon.stop() == 0, daemon.stderr
