"""``rte serve --replicas N``: N supervised daemons, found as one pool, a crashed one
restarted (and said so), all stopped by one SIGTERM (real processes, real kills)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time

from daemon_harness import DaemonProcess, Deadline, ended, running
from test_cli import one_line_error, rte_command

from rte.cli.serve import OPTIONS, _children
from rte.client import PoolClient, connect
from rte.protocol.names import DaemonNames
from shm import Segment
from shm.names import objects, shm_name


def until_ready(supervisor: DaemonProcess) -> None:
    limit = Deadline(what="both replicas ready")
    while "rte serve: ready pid=" not in supervisor.said():
        limit.check(supervisor.said())
        assert supervisor.process.poll() is None, supervisor.said()
        time.sleep(0.05)


def pid_of(name: str) -> int | None:
    """The pid of the live daemon ``name`` (None while there is none)."""
    try:
        segment = Segment.open(DaemonNames(name).control, readonly=True)
    except Exception:
        return None
    try:
        return segment.creator_pid if segment.creator_alive() else None
    finally:
        segment.close()


def test_replicas_are_supervised_pooled_restarted_and_stopped(shm_prefix: str) -> None:
    name = f"{shm_prefix}r"
    # the count from the environment, as RTE_* settings may: the children serve alone
    env = {"RTE_REPLICAS": "2"}
    supervisor = DaemonProcess(name, "--model", "null", "--max-sessions", "2", env=env)
    try:
        until_ready(supervisor)
        with connect(name, timeout=30) as pool:
            assert isinstance(pool, PoolClient)
            assert sorted(pool.members) == [f"{name}-0", f"{name}-1"]
            pool.attach("a")
            pool.attach("b")
            assert set(pool.home.values()) == {f"{name}-0", f"{name}-1"}
        first = pid_of(f"{name}-1")
        assert first is not None
        os.kill(first, signal.SIGKILL)
        limit = Deadline(what="the killed replica restarted")
        while (again := pid_of(f"{name}-1")) in (None, first):
            limit.check(supervisor.said())
            time.sleep(0.05)
        assert again != first
        assert pid_of(f"{name}-0-0") is None  # no child became a supervisor itself
        assert f"{name}-1 (pid {first}) exited with -9; restarting in 1s" in supervisor.said()
        with connect(f"{name}-1", timeout=30) as client:  # it serves again
            client.attach("c")
    finally:
        code = supervisor.stop()
    assert code == 0, supervisor.stderr
    assert pid_of(f"{name}-0") is None and pid_of(f"{name}-1") is None
    assert objects(shm_name(name)) == []  # every child unlinked its shared memory


def test_a_burst_of_sigterms_stops_the_supervisor_and_every_replica(shm_prefix: str) -> None:
    name = f"{shm_prefix}b"
    supervisor = DaemonProcess(name, "--replicas", "2", "--model", "null")
    until_ready(supervisor)
    supervisor.burst()
    assert supervisor.stop(timeout=40) == 0, supervisor.stderr
    assert objects(shm_name(name)) == []  # every child unlinked its shared memory


def test_a_replica_that_cannot_start_stops_the_supervisor_with_its_words(
    shm_prefix: str,
) -> None:
    supervisor = DaemonProcess(f"{shm_prefix}x", "--replicas", "2", "--model", "bogus")
    assert supervisor.process.wait(60) == 2
    said = supervisor.said()
    assert "did not start (exit 2)" in said and "bogus" in said
    supervisor.stop()


def test_replicas_and_devices_are_checked(shm_prefix: str) -> None:
    for args, words in (
        (("--replicas", "0"), "--replicas 0: at least 1"),
        (("--devices", "a,b"), "GPU indices"),
        (("--replicas", "2", "--devices", "0"), "give one"),
    ):
        d = DaemonProcess(f"{shm_prefix}c", *args)
        assert d.process.wait(60) == 2
        assert words in d.said()
        d.stop()


def test_each_replica_gets_its_own_metrics_port() -> None:
    values = {option.key: option.default for option in OPTIONS}
    values |= {"name": "m", "metrics_port": 9100}
    for key in ("log_level", "replicas", "devices"):
        values.pop(key)
    children = _children(values, 3, None, "info")
    ports = [c.command[c.command.index("--metrics-port") + 1] for c in children]
    assert ports == ["9100", "9101", "9102"]
    assert [c.name for c in children] == ["m-0", "m-1", "m-2"]


def test_a_sigkilled_supervisor_s_replicas_stop_and_unlink_everything(shm_prefix: str) -> None:
    name = f"{shm_prefix}k"
    supervisor = DaemonProcess(name, "--replicas", "2", "--model", "null")
    pids: list[int] = []
    try:
        until_ready(supervisor)
        pids = [pid for i in range(2) if (pid := pid_of(f"{name}-{i}")) is not None]
        assert len(pids) == 2, supervisor.said()
        supervisor.kill()  # SIGKILL: no finally of its runs
        limit = Deadline(what="the replicas of a killed supervisor stopped")
        while not all(ended(pid) for pid in pids) or objects(shm_name(name)):
            limit.check((pids, objects(shm_name(name))))
            time.sleep(0.05)
    finally:
        for pid in pids:  # a replica that outlived it would serve for ever: not after us
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_ready_line_names_the_supervisor_first_as_the_one_to_stop(shm_prefix: str) -> None:
    name = f"{shm_prefix}p"
    with running(name, "--replicas", "2", "--model", "null") as supervisor:
        until_ready(supervisor)
        pids = [pid_of(f"{name}-{i}") for i in range(2)]
        me = supervisor.pid
        line = (
            f"rte serve: ready pid={me} children={name}-0,{name}-1 child_pids={pids[0]},{pids[1]}"
        )
        assert line in supervisor.said(), supervisor.said()
        assert (
            f"to stop them all: kill {me}; a child killed alone is restarted" in supervisor.said()
        )


def test_inspect_and_clean_understand_a_pools_name(shm_prefix: str) -> None:
    name = f"{shm_prefix}q"
    supervisor = DaemonProcess(name, "--replicas", "2", "--model", "null")
    pids: list[int] = []
    try:
        until_ready(supervisor)
        shown = rte_command("inspect", name)
        assert shown.returncode == 0, shown.stderr
        assert f"pool {name}: 2 daemons" in shown.stdout
        for i in range(2):
            assert re.search(rf"^{name}-{i}\s+\d+\s+alive", shown.stdout, re.M), shown.stdout
        one_line_error(rte_command("inspect", name, "--ring", "0"), 1, "name one of them")
        one_line_error(rte_command("clean", name), 1, "is alive")  # live members: refused
        # leave its children's leftovers: stop the supervisor, SIGKILL them, then it
        pids = [pid for i in range(2) if (pid := pid_of(f"{name}-{i}")) is not None]
        os.kill(supervisor.pid, signal.SIGSTOP)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        supervisor.kill()
        assert objects(shm_name(f"{name}-0")) and objects(shm_name(f"{name}-1"))
        done = rte_command("clean", name)
        assert done.returncode == 0, done.stderr
        assert f"of '{name}-0'" in done.stdout and f"of '{name}-1'" in done.stdout
        assert objects(shm_name(name)) == []
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        supervisor.stop()
        DaemonNames(f"{name}-0").remove_leftovers()
        DaemonNames(f"{name}-1").remove_leftovers()


def test_a_pool_and_a_single_daemon_of_one_name_refuse_each_other(shm_prefix: str) -> None:
    name = f"{shm_prefix}s"
    with running(name, "--model", "null") as single:
        single.client().close()
        pool = DaemonProcess(name, "--replicas", "2", "--model", "null")
        assert pool.process.wait(60) == 2
        pool.stop()
        assert f"a daemon named {name!r} runs (pid {single.pid})" in pool.stderr, pool.stderr
        assert pool.stderr.count("\n") == 1, pool.stderr
    with running(name, "--replicas", "2", "--model", "null") as supervisor:
        until_ready(supervisor)
        alone = DaemonProcess(name, "--model", "null")
        assert alone.process.wait(60) == 2
        alone.stop()
        assert f"a pool named {name!r} runs ({name}-0, {name}-1)" in alone.stderr, alone.stderr
        with connect(name) as pool_client:
            assert isinstance(pool_client, PoolClient)  # the pool, whole
