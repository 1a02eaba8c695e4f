"""The command line, through real subprocesses: every mistake is one line on stderr
and a non-zero exit, never a traceback (unless ``--debug``), and never a wait
for something that cannot come."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from child_python import python_c
from daemon_harness import DaemonProcess, leftovers, running

import rte
from rte import EngineGone, RequestError
from rte.client import connect
from rte.protocol.names import DaemonNames
from shm.names import objects, shm_name


def rte_command(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rte", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.count("\n") == 1, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


def demo_leftovers(pid: int) -> list[str]:
    return objects(shm_name(f"demo-{pid}-x")[: -len("x")])  # the demo names its daemon so


def test_version() -> None:
    done = rte_command("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"rte {rte.__version__}"


def test_demo_streams_writes_its_png_and_leaves_nothing(tmp_path: Path) -> None:
    png = tmp_path / "sheet.png"
    done = subprocess.Popen(
        [sys.executable, "-m", "rte", "demo", "--seconds", "1", "--png", str(png)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    assert "chunks/s in all" in out and "session-3" in out
    assert "model world" in out  # the trained world is the default
    assert png.read_bytes().startswith(b"\x89PNG")
    assert "left in /dev/shm: nothing" in out
    assert demo_leftovers(done.pid) == []


def test_demo_with_a_model_that_does_not_exist_says_so_at_once() -> None:
    started = time.monotonic()
    done = rte_command("demo", "--model", "bogus")
    one_line_error(done, 1, "did not start (exit 2)", "--model bogus")
    assert time.monotonic() - started < 30  # not connect's 60 s timeout


def test_demo_refuses_what_it_could_not_finish_before_it_starts() -> None:
    done = rte_command("demo", "--png", "/nonexistent/folder/sheet.png")
    one_line_error(done, 2, "--png /nonexistent/folder/sheet.png: cannot write there")
    assert "chunks/s" not in done.stdout
    one_line_error(rte_command("demo", "--sessions", "0"), 2, "--sessions 0")


def test_ctrl_c_on_demo_prints_what_came_before_and_cleans_up() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "rte", "demo", "--seconds", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert demo.stdout is not None
    try:
        deadline = time.monotonic() + 60
        while "chunks/s in all" not in demo.stdout.readline():  # streaming: interrupt it
            assert time.monotonic() < deadline and demo.poll() is None
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130, err
    assert "Traceback" not in out + err
    assert "latency p50 ms" in out  # the summary of what came
    assert "interrupted" in err and err.count("\n") == 1
    assert demo_leftovers(demo.pid) == []


def test_serve_and_inspect_mistakes_are_one_line(shm_prefix: str) -> None:
    one_line_error(
        rte_command("serve", "--name", shm_prefix, "--max-sessions", "0"), 2, "--max-sessions"
    )
    done = rte_command("inspect", f"{shm_prefix}none")
    one_line_error(done, 1, f"no daemon named {shm_prefix}none (")
    assert "/rte." not in done.stderr  # no internal object's name
    done = rte_command("--debug", "inspect", f"{shm_prefix}none")  # --debug: the traceback
    assert done.returncode == 1 and "Traceback" in done.stderr


def test_clean_removes_a_dead_daemons_leftovers_and_refuses_a_live_one(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix)
    with d.client() as client:
        client.attach("a")
    one_line_error(rte_command("clean", shm_prefix), 1, "is alive")
    d.kill()  # SIGKILL: nothing cleaned up
    assert leftovers(shm_prefix) != []
    done = rte_command("clean", shm_prefix)
    assert done.returncode == 0 and "removed" in done.stdout, done.stderr
    assert leftovers(shm_prefix) == []


@pytest.mark.parametrize("command", ["serve", "demo", "play", "inspect", "clean", "bench"])
def test_help_is_plain_text(command: str) -> None:
    done = rte_command(command, "--help")
    assert done.returncode == 0
    for markup in ("``", ":class:", ":func:", ":mod:"):
        assert markup not in done.stdout, (command, markup)


def test_a_bug_is_named_as_one_without_a_traceback() -> None:
    code = (
        "import sys\n"
        "from rte import cli\n"
        "from rte.cli import clean\n"
        "def broken(args):\n"
        "    raise KeyError('oops')\n"
        "clean.run = broken\n"
        "sys.exit(cli.main(['clean', 'x']))\n"
    )
    done = python_c(code)
    one_line_error(done, 1, "KeyError", "a bug: run with --debug")


# -- rte serve: settings from the command line, the environment, a file; its log --------


def _max_sessions(shm_prefix: str, *args: str, env: dict[str, str] | None = None) -> int:
    with running(shm_prefix, *args, env=env) as d, d.client() as client:
        return client.manifest.max_sessions


def test_serve_takes_settings_from_cli_then_environment_then_config(
    shm_prefix: str, tmp_path: Path
) -> None:
    config = tmp_path / "rte.toml"
    config.write_text('max-sessions = 5\nmodel = "null"\n')
    env = {"RTE_MAX_SESSIONS": "3"}
    assert _max_sessions(shm_prefix, "--config", str(config), "--max-sessions", "2", env=env) == 2
    assert _max_sessions(shm_prefix, "--config", str(config), env=env) == 3
    assert _max_sessions(shm_prefix, "--config", str(config)) == 5


def test_serve_refuses_a_bad_setting_from_anywhere_in_one_line(
    shm_prefix: str, tmp_path: Path
) -> None:
    config = tmp_path / "rte.toml"
    config.write_text("max-sesions = 5\n")
    done = rte_command("serve", "--name", shm_prefix, "--config", str(config))
    one_line_error(done, 2, "unknown setting 'max-sesions'")
    done = subprocess.run(
        [sys.executable, "-m", "rte", "serve", "--name", shm_prefix],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "RTE_MAX_SESSIONS": "many"},
    )
    one_line_error(done, 2, "RTE_MAX_SESSIONS: 'many' is not a valid int")
    one_line_error(rte_command("serve"), 2, "--name is required")
    assert leftovers(shm_prefix) == []


STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} rte serve"


def test_serve_logs_clients_sessions_and_refusals_with_time_and_level(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix)
    with d.client() as client:
        client.attach("a")
        with pytest.raises(RequestError):
            client.attach("b", {"nope": 1})
        client.detach("a")
    assert d.stop() == 0
    for line in (
        r"INFO client 0 \(pid \d+\) connected",
        r"INFO client 0: attached 'a'",
        r"WARNING client 0: error 'b': ValueError: unknown conditioning key 'nope'",
        r"INFO client 0: detached 'a'",
        r"INFO client 0 \(pid \d+\) left",
    ):
        assert re.search(f"^{STAMP} {line}", d.stderr, re.MULTILINE), (line, d.stderr)
    quiet = DaemonProcess(f"{shm_prefix}q", "--log-level", "warning")
    with quiet.client() as client:
        client.attach("a")
    assert quiet.stop() == 0
    assert "INFO" not in quiet.stderr and "ready name=" in quiet.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["serve", "--bogus"], "unrecognized arguments: --bogus"),
        (["serve", "--name", "x", "--max-sessions", "many"], "invalid int value: 'many'"),
        ([], "required: COMMAND"),
    ],
)
def test_a_mistyped_command_line_is_one_line_not_the_usage(args: list[str], words: str) -> None:
    one_line_error(rte_command(*args), 2, words, "--help)")


def test_serve_with_a_metrics_port_taken_says_so_and_leaves_nothing(shm_prefix: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = rte_command("serve", "--name", shm_prefix, "--metrics-port", port)
    one_line_error(done, 2, f"--metrics-port {port}")
    assert leftovers(shm_prefix) == []


@pytest.mark.parametrize(
    "args",
    [
        ["serve", "--name", "{name}", "--max-session", "3"],  # took for --max-sessions
        ["serve", "--name", "{name}", "--slab", "8"],  # --slab-slots
        ["inspect", "--jso"],  # --json
        ["--deb", "inspect"],  # --debug
    ],
)
def test_an_abbreviated_option_is_a_mistake_not_another_option(
    shm_prefix: str, args: list[str]
) -> None:
    done = rte_command(*(a.format(name=shm_prefix) for a in args), timeout=60)
    one_line_error(done, 2, "unrecognized arguments: --", "--help)")
    assert leftovers(shm_prefix) == []


# -- wrong or dead names: said at once, unless asked to wait --------------------------


def test_connect_to_no_daemon_or_a_dead_one_fails_at_once_saying_how_to_start_one(
    shm_prefix: str,
) -> None:
    def refused(name: str, words: str) -> None:
        started = time.monotonic()
        with pytest.raises(EngineGone, match=words):
            connect(name)
        assert time.monotonic() - started < 2.5  # at once: it waited 5 s

    refused(f"{shm_prefix}n", f"no daemon named '{shm_prefix}n'.*rte serve --name {shm_prefix}n")
    d = DaemonProcess(shm_prefix, "--model", "null")
    d.client().close()
    refused(f"{shm_prefix}n", f"no daemon named .*running: .*{shm_prefix}")  # names those up
    d.kill()  # its segments stay, their creator dead
    refused(shm_prefix, f"daemon '{shm_prefix}' is dead .*rte clean {shm_prefix}")
    DaemonNames(shm_prefix).remove_leftovers()


def test_connect_with_a_timeout_waits_for_a_daemon_to_come_up(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix, "--model", "null")  # launched, not up yet: waited for
    try:
        with connect(shm_prefix, timeout=30) as client:
            assert client.manifest.model == "null"
    finally:
        assert d.stop() == 0, d.stderr


@pytest.mark.parametrize("command", ["demo", "play"])
def test_a_command_given_a_name_with_no_daemon_says_so_at_once(
    shm_prefix: str, command: str
) -> None:
    started = time.monotonic()
    done = rte_command(command, "--name", f"{shm_prefix}n", timeout=60)
    one_line_error(done, 1, f"no daemon named '{shm_prefix}n'", f"rte serve --name {shm_prefix}n")
    assert time.monotonic() - started < 8  # not a wait of 10 s (play) or 60 s (demo)
    waited = rte_command(command, "--name", f"{shm_prefix}n", "--wait", "0.5", timeout=60)
    assert waited.returncode == 1, waited.stderr
    assert f"waiting up to 0.5 s for daemon '{shm_prefix}n'" in waited.stderr  # it says so
    assert "Traceback" not in waited.stderr


def test_clean_of_a_name_with_nothing_in_dev_shm_is_a_mistake(shm_prefix: str) -> None:
    done = rte_command("clean", f"{shm_prefix}typo")
    one_line_error(done, 1, f"nothing of a daemon named '{shm_prefix}typo' in /dev/shm")
    assert "removed" not in done.stdout


# -- details: help, bad values, the pace, a stale heartbeat, a closed pipe ------------


def test_demo_refuses_seconds_that_are_not_a_duration_and_its_help_says_the_defaults() -> None:
    for seconds in ("-1", "0", "nan", "inf"):
        one_line_error(rte_command("demo", "--seconds", seconds), 2, f"--seconds {seconds}")
    helped = " ".join(rte_command("demo", "--help").stdout.split())
    assert "sessions to stream, at least 1 (default 4)" in helped
    assert "how long to stream, above 0 (default 3)" in helped
    assert rte_command("serve", "--help").stdout.count("(default 2)") == 1  # --credits once


def test_the_ready_line_and_inspect_show_the_pace_and_the_rows_the_manifest_has(
    shm_prefix: str,
) -> None:
    with running(shm_prefix, "--model", "null", "--pace-hz", "20", "--engines", "2") as d:
        d.client().close()
        ready = d.said()
        assert "max_sessions=16 (--engines 2 x --max-sessions 8) pace=20Hz" in ready, ready
        shown = rte_command("inspect", shm_prefix)
        assert shown.returncode == 0, shown.stderr
        assert "pace 20 Hz" in shown.stdout and "sessions 0/16" in shown.stdout
        listed = rte_command("inspect")
        row = next(line for line in listed.stdout.splitlines() if line.startswith(shm_prefix))
        assert "20 Hz" in row and "alive" in row, row
    with running(shm_prefix, "--model", "null") as unpaced:
        unpaced.client().close()
        assert "max_sessions=8 pace=unpaced " in unpaced.said(), unpaced.said()


def test_inspect_flags_a_stopped_daemons_stale_heartbeat(shm_prefix: str) -> None:
    with running(shm_prefix, "--model", "null") as d:
        d.client().close()
        fresh = rte_command("inspect", shm_prefix)
        assert "heartbeat stale" not in fresh.stdout, fresh.stdout
        os.kill(d.pid, signal.SIGSTOP)
        try:
            time.sleep(1.5)  # past the beat a live daemon keeps (1 s)
            shown = rte_command("inspect", shm_prefix)
            listed = rte_command("inspect")
        finally:
            os.kill(d.pid, signal.SIGCONT)
        assert re.search(r"alive, heartbeat stale \d+\.\d s: stopped or hung\?", shown.stdout)
        assert "STALE" in listed.stdout and "stopped or hung?" in listed.stdout, listed.stdout


def test_inspect_into_a_closed_pipe_ends_quietly(shm_prefix: str) -> None:
    with running(shm_prefix, "--model", "null") as d:
        d.client().close()
        for args in ((shm_prefix,), (), (shm_prefix, "--json")):
            reader, writer = os.pipe()
            os.close(reader)  # as head does once it has its lines
            done = subprocess.run(
                [sys.executable, "-m", "rte", "inspect", *args],
                stdout=writer,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                check=False,
            )
            os.close(writer)
            assert done.returncode == 0, done.stderr
            assert done.stderr == "", done.stderr
