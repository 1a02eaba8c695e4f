"""A daemon's settings: refused at start, in one line with exit 2, when the control
layout, a ring or the memory they imply cannot hold them (never after "ready"), and
sized by default so that one client drives every session at full rate.

The refusals run through real ``rte serve`` processes; the sizes they follow are
checked on :class:`~rte.ipc.settings.Settings` itself."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import Deadline, leftovers, running

from rte.cli import OneLineParser
from rte.cli import serve as serve_command
from rte.credits import chunks_to_drive
from rte.errors import ConfigurationError
from rte.ipc.settings import Settings
from rte.ipc.sources import Option, options_of, read
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
    with (
        running(shm_prefix, "--model", "null", "--max-sessions", str(rows)) as d,
        d.client() as client,
    ):
        for i in range(rows):
            client.attach(f"s{i}")
        widest, limit = 0, Deadline(what="a step of every session")
        while widest < rows:
            limit.check(widest)
            batch = client.poll_batch(timeout=5)
            assert batch is not None
            with batch:
                widest = max(widest, len(batch))


# -- written once: every field is a flag, an RTE_* variable and a TOML key ----------------


def _example(option: Option) -> Any:
    """A value of ``option``'s kind that is not its default."""
    if option.choices:
        return next(c for c in reversed(option.choices) if c != option.default)
    examples = {int: 7, float: 0.25, str: "cuda:1", dict: {"cost": 2, "on": False, "w": "r"}}
    return examples[option.type]


def _toml(key: str, value: Any) -> str:
    if isinstance(value, dict):
        lines = [
            f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}" for k, v in value.items()
        ]
        return f"[{key}]\n" + "\n".join(lines) + "\n"
    return f"{key} = {json.dumps(value)}\n"


def _parsed(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="rte")
    serve_command.add_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_every_field_is_an_option_with_a_flag_an_environment_name_and_a_toml_key() -> None:
    fields = [
        f.name for cls in (Settings, serve_command.ServeOptions) for f in dataclasses.fields(cls)
    ]
    assert [o.key for o in serve_command.OPTIONS] == fields
    helped = " ".join(serve_help().split())
    for option in serve_command.OPTIONS:
        assert option.help and f"--{option.flag}" in helped
        assert option.env == f"RTE_{option.key.upper()}"
        assert option.toml.replace("-", "_") == option.key
    defaults = {o.key: o.default for o in options_of(Settings)}
    assert Settings(**{**defaults, "name": "d"}) == Settings("d")  # the defaults are its own


def serve_help() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "rte", "serve", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


@pytest.mark.parametrize("option", serve_command.OPTIONS, ids=lambda o: o.key)
def test_each_setting_round_trips_through_every_source(option: Option, tmp_path: Path) -> None:
    value = _example(option)
    given = {"name": "d"} if option.key != "name" else {}
    base = ["--name", "d"] if option.key != "name" else []
    from_flag = read(serve_command.OPTIONS, vars(_parsed([*base, *option.argv(value)])), {})
    from_env = read(serve_command.OPTIONS, given, {option.env: option.text(value)})
    config = tmp_path / "rte.toml"
    config.write_text(_toml(option.toml, value))
    from_file = read(serve_command.OPTIONS, given, {}, config)
    for got in (from_flag, from_env, from_file):
        assert got[option.key] == value
        assert {k: v for k, v in got.items() if k not in (option.key, "name")} == {
            o.key: o.default for o in serve_command.OPTIONS if o.key not in (option.key, "name")
        }


def test_the_command_line_wins_then_the_environment_then_the_file(tmp_path: Path) -> None:
    config = tmp_path / "rte.toml"
    config.write_text('name = "f"\nmax_sessions = 5\npace-hz = 20\n[model-settings]\ncost = 1\n')
    env = {"RTE_MAX_SESSIONS": "3", "RTE_MODEL_SETTINGS": "cost=2,w=r"}
    got = read(serve_command.OPTIONS, vars(_parsed(["--max-sessions", "2"])), env, config)
    assert (got["name"], got["max_sessions"], got["pace_hz"]) == ("f", 2, 20.0)
    assert got["model_settings"] == {"cost": 2, "w": "r"}
    assert read(serve_command.OPTIONS, {}, env, config)["max_sessions"] == 3
    assert read(serve_command.OPTIONS, {}, {}, config)["max_sessions"] == 5


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"RTE_MAX_SESSIONS": "many"}, "RTE_MAX_SESSIONS: 'many' is not a valid int"),
        ({"RTE_ADMISSION": "fast"}, "RTE_ADMISSION: 'fast' is not one of realtime, rows"),
        ({"RTE_MODEL_SETTINGS": "cost"}, "RTE_MODEL_SETTINGS 'cost': KEY=VALUE"),
        ({}, "--name is required (or RTE_NAME, or name in --config)"),
    ],
)
def test_a_value_that_is_not_one_names_where_it_came_from(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        read(serve_command.OPTIONS, {}, {"RTE_NAME": "d", **env} if env else {})


def test_a_supervisor_passes_every_setting_on_as_its_command_line() -> None:
    values = {o.key: _example(o) for o in options_of(Settings)} | {"name": "p", "metrics_port": 0}
    (child,) = serve_command._children(values, 1, None, "debug")
    argv = child.command[child.command.index("serve") + 1 :]
    got = read(serve_command.OPTIONS, vars(_parsed(argv)), {})
    assert got == {**values, "name": "p-0", "replicas": None, "devices": None, "log_level": "debug"}
