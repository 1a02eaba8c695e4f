"""A daemon's settings: refused at start, in one line with exit 2, when the control
layout, a ring or the memory they imply cannot hold them (never after "ready"), and
sized by default so that one client drives every session at full rate.

The refusals run through real ``rte serve`` processes; the sizes they follow are
checked on :class:`~rte.ipc.settings.Settings` itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from daemon_harness import DaemonProcess, Deadline, leftovers

from rte.credits import chunks_to_drive
from rte.errors import ConfigurationError
from rte.ipc.settings import Settings
from rte.protocol.control import MAX_SESSIONS
from shm.names import SHM_DIR


def serve(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rte", "serve", "--name", name, *args],
        capture_output=True,
        text=True,
        timeout=90,  # a daemon that started anyway is killed here, and the test fails
        check=False,
    )


SMALL = ("--model", "null", "--input-slots", "0")  # what else fits in /dev/shm


def free_shm() -> int:
    stat = os.statvfs(SHM_DIR)
    return stat.f_bavail * stat.f_frsize


# -- refused at start, through rte serve ---------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        # the control layout holds MAX_SESSIONS rows (once "ready": "corrupt settings")
        ([*SMALL, "--max-sessions", str(MAX_SESSIONS + 1)], f"at most {MAX_SESSIONS} rows"),
        ([*SMALL, "--engines", "2", "--max-sessions", "40000"], "--engines 2 = 80000 rows: at"),
        # a quota below its sessions' credits: throttled silently, before
        (["--max-sessions", "3", "--max-clients", "4", "--slab-slots", "16"], "--slab-slots 36"),
        (["--quota", "3"], "use --quota 24"),
        # a ring that cannot carry one step's record for a client of every row
        (["--model", "null", "--ring-kib", "4", "--max-sessions", "100"], "use --ring-kib 8"),
        # a period the next-tick word cannot hold (an OverflowError after "ready")
        (["--pace-hz", "1e-300"], "--pace-hz 1e-300: must be 0 (flat out) or 0.001"),
        (["--pace-hz", "nan"], "--pace-hz nan"),
        (["--max-clients", "1025"], "--max-clients 1025: at most 1024"),
    ],
)
def test_a_setting_the_layout_cannot_hold_is_refused_before_ready(
    shm_prefix: str, args: list[str], says: str
) -> None:
    done = serve(shm_prefix, *args)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("rte serve: ") and says in line, line
    assert "Traceback" not in done.stderr and "ready" not in done.stderr
    assert leftovers(shm_prefix) == []


def test_settings_whose_segments_dev_shm_cannot_hold_are_refused_naming_the_fix(
    shm_prefix: str,
) -> None:
    slot_kib = free_shm() // 1024 // 4 + 1  # eight of them: twice what is free
    done = serve(
        shm_prefix, "--model", "null", "--input-slots", "8", "--input-slot-kib", str(slot_kib)
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "of shared memory" in line and f"{SHM_DIR} has" in line
    assert "--input-slot-kib" in line and "--shm-size" in line
    assert "ready" not in done.stderr
    assert leftovers(shm_prefix) == []


# -- what the sizes follow ------------------------------------------------------------


def test_by_default_one_client_may_hold_every_rows_credits_and_clients_cannot_starve() -> None:
    for rows, clients, credits, engines in [(8, 8, 2, 1), (160, 8, 2, 1), (60, 2, 5, 3)]:
        s = Settings("d", max_sessions=rows, max_clients=clients, credits=credits, engines=engines)
        need = chunks_to_drive(rows * engines, credits)
        assert s.client_quota == need >= rows * engines * credits
        assert s.slab_slot_count == clients * need  # every client's quota: none starves
        assert s.step_rows == rows * engines
    assert Settings("d").ring_capacity == 256 * 1024
    many = Settings("d", model="null", max_sessions=20000)  # a step of every row fits a ring
    assert many.ring_capacity // 2 > 20000 * 36


def test_explicit_sizes_are_kept_when_they_hold_and_refused_when_they_throttle() -> None:
    s = Settings("d", max_sessions=4, max_clients=2, slab_slots=40)
    assert (s.slab_slot_count, s.client_quota) == (40, 20)
    assert Settings("d", max_sessions=4, quota=9).slab_slot_count == 8 * 9
    for kwargs, fix in [
        ({"slab_slots": 64}, "use --slab-slots 192"),  # the old default: 8 slots a client
        ({"quota": 8}, "use --quota 24"),
        ({"quota": 8, "slab_slots": 64}, "use --quota 24 --slab-slots 192"),
        ({"quota": 8, "slab_slots": 8, "max_clients": 2}, "clients could starve"),
    ]:
        with pytest.raises(ConfigurationError, match=fix):
            Settings("d", **kwargs)  # type: ignore[arg-type]


def test_memory_is_checked_against_what_is_free() -> None:
    s = Settings("d", max_sessions=16, max_clients=4, input_slots=0)
    sizes = s.segment_bytes(12288)
    assert set(sizes) == {"slab", "control"}
    assert sizes["slab"] >= s.slab_slot_count * 12288
    s.check_memory(12288, free=sum(sizes.values()))
    with pytest.raises(ConfigurationError, match="fewer --max-clients, --max-sessions or"):
        s.check_memory(12288, free=sum(sizes.values()) - 1)


# -- out of the box, one client drives every session ------------------------------------


def test_one_client_steps_every_session_at_once_with_the_default_settings(
    shm_prefix: str,
) -> None:
    rows = 24  # the old default quota (64 slots / 8 clients) stepped 8 of them at a time
    d = DaemonProcess(shm_prefix, "--model", "null", "--max-sessions", str(rows))
    try:
        with d.client() as client:
            for i in range(rows):
                client.attach(f"s{i}")
            widest, limit = 0, Deadline(what="a step of every session")
            while widest < rows:
                limit.check(widest)
                batch = client.poll_batch(timeout=5)
                assert batch is not None
                with batch:
                    widest = max(widest, len(batch))
    finally:
        assert d.stop() == 0, d.stderr
