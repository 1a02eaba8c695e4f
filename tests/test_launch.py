"""The launcher (:class:`rte.launch.LaunchedDaemon`) with real daemons: ready,
connected sync and asyncio, a failed start said at once in the daemon's own
words, a wait that says what it waits for, a stop that kills what will not go
and removes what it left, and never another daemon's objects. The waiting line
of a command (:class:`rte.cli.progress.Waiting`) on a terminal and off one."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import time
from pathlib import Path

import pytest
from daemon_harness import TESTS, DaemonProcess

from rte.cli.progress import QUIET_S, Waiting
from rte.errors import EngineGone, RequestTimeout
from rte.launch import LaunchedDaemon
from rte.protocol.names import DaemonNames

NULL = ("--model", "null", "--max-sessions", "2")


def environment(**extra: str) -> dict[str, str]:
    """This process's environment with tests/ on the path (for the tests' models)."""
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def test_a_launched_daemon_is_ready_connected_and_stopped_leaving_nothing(
    shm_prefix: str,
) -> None:
    with LaunchedDaemon(f"{shm_prefix}a", NULL) as daemon:
        line = daemon.wait_ready()
        assert line.startswith(f"ready name={shm_prefix}a pid={daemon.pid} "), line
        with daemon.connect() as client:
            client.attach("s")
            assert client.poll(timeout=10) is not None
    assert daemon.process.returncode == 0, daemon.said()
    assert daemon.stop() == 0  # again: the same code, nothing more done
    assert daemon.leftovers() == []
    assert "stopped; its shared memory is unlinked" in daemon.said()


def test_an_asyncio_caller_connects_once_the_daemon_is_ready(shm_prefix: str) -> None:
    async def body(daemon: LaunchedDaemon) -> int:
        client = await daemon.connect_async()
        try:
            await client.attach("s")
            chunk = await client.poll(timeout=10)
            assert chunk is not None
            chunk.release()
            return client.manifest.max_sessions
        finally:
            await client.close()

    with LaunchedDaemon(f"{shm_prefix}b", NULL) as daemon:
        assert asyncio.run(body(daemon)) == 2


def test_a_daemon_that_cannot_start_is_said_at_once_in_its_own_words(shm_prefix: str) -> None:
    daemon = LaunchedDaemon(f"{shm_prefix}c", ("--model", "bogus"))
    started = time.monotonic()
    with pytest.raises(EngineGone, match=r"did not start \(exit 2\): --model bogus"):
        daemon.wait_ready(timeout=120)
    assert time.monotonic() - started < 60  # its exit, not the timeout, ended the wait
    assert daemon.stop() == 2


def test_a_wait_says_what_it_waits_for_and_a_timeout_leaves_the_daemon_running(
    shm_prefix: str, tmp_path: Path
) -> None:
    env = environment(RTE_TEST_LOADING=str(tmp_path / "loading"), RTE_TEST_LOAD_S="6")
    daemon = LaunchedDaemon(f"{shm_prefix}d", ("--model", "slow_model:slow_reference"), env=env)
    told: list[tuple[str, float]] = []
    try:
        with pytest.raises(RequestTimeout, match=r"was not ready in 2\.5 s and still runs"):
            daemon.wait_ready(timeout=2.5, progress=lambda what, s: told.append((what, s)))
        assert daemon.running
        assert told, "the wait said nothing"
        what, elapsed = told[-1]
        assert what == f"daemon '{shm_prefix}d' (pid {daemon.pid}) to be ready"
        assert [s for _, s in told] == sorted(s for _, s in told) and 0 < elapsed <= 2.5
    finally:
        assert daemon.stop() == 0, daemon.said()  # SIGTERM while loading: a clean stop
    assert daemon.leftovers() == []


def test_a_daemon_that_will_not_stop_is_killed_and_what_it_left_is_removed(
    shm_prefix: str,
) -> None:
    daemon = LaunchedDaemon(f"{shm_prefix}e", NULL)
    daemon.wait_ready()
    assert daemon.leftovers()
    os.kill(daemon.pid, signal.SIGSTOP)  # SIGTERM is held while it is stopped
    assert daemon.stop(grace=0.5) == -signal.SIGKILL
    assert daemon.leftovers() == []


def test_a_stop_never_removes_another_live_daemons_objects(shm_prefix: str) -> None:
    name = f"{shm_prefix}f"
    with LaunchedDaemon(name, NULL) as first:
        first.wait_ready()
        second = LaunchedDaemon(name, NULL)
        with pytest.raises(EngineGone, match=r"did not start \(exit 2\).*already running"):
            second.wait_ready()
        assert second.stop() == 2
        assert second.remove_leftovers() == []  # the live one holds the name
        with first.connect() as client:  # untouched
            client.attach("s")
            assert client.poll(timeout=10) is not None
    assert DaemonNames(name).leftovers() == []


def test_an_echoed_daemon_hands_on_each_line_and_keeps_its_tail(shm_prefix: str) -> None:
    lines: list[str] = []
    with LaunchedDaemon(f"{shm_prefix}g", NULL, echo=lines.append) as daemon:
        daemon.wait_ready()
        assert any(x.startswith("rte serve: ready ") for x in lines), lines
    assert lines[-1].endswith("stopped; its shared memory is unlinked"), lines
    assert daemon.said().splitlines() == lines
    assert daemon.last_words().endswith("stopped; its shared memory is unlinked")


def test_the_tests_harness_is_the_launcher_leaving_leftovers_to_the_test(
    shm_prefix: str,
) -> None:
    """A test checks what the daemon itself removed: the harness's kill leaves it."""
    daemon = DaemonProcess(f"{shm_prefix}h", *NULL)
    daemon.client().close()
    daemon.kill()
    assert daemon.leftovers()
    assert daemon.remove_leftovers()
    assert daemon.leftovers() == []


# -- the waiting line ---------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_wait_is_one_line_rewritten_then_erased() -> None:
    screen = Terminal()
    with Waiting("rte demo", screen) as progress:
        progress("daemon 'd' (pid 1) to be ready", 1.0)
        progress("daemon 'd' (pid 1) to be ready", 2.0)
    text = screen.getvalue()
    assert "\n" not in text
    assert text.endswith("\r\033[K")  # erased: what comes next starts a clean line
    assert text.count("rte demo: waiting for daemon 'd' (pid 1) to be ready: 2 s") == 1


def test_off_a_terminal_a_short_wait_says_nothing_and_a_long_one_a_line_now_and_then() -> None:
    log = io.StringIO()
    progress = Waiting("rte play", log)
    for second in range(1, int(QUIET_S)):
        progress("daemon 'd' (pid 1) to be ready", float(second))
    assert log.getvalue() == ""
    for second in range(int(QUIET_S), int(3 * QUIET_S) + 1):
        progress("daemon 'd' (pid 1) to be ready", float(second))
    progress.done()
    lines = log.getvalue().splitlines()
    assert lines == [
        f"rte play: waiting for daemon 'd' (pid 1) to be ready: {n * QUIET_S:.0f} s"
        for n in (1, 2, 3)
    ]
