"""``rte serve``: run the engine daemon in the foreground until SIGTERM or Ctrl-C.

Every setting comes from, the first that has it winning: the command line, an
``RTE_*`` environment variable (``RTE_MAX_SESSIONS=16``), a TOML file named by
``--config`` (``max-sessions = 16``, or ``max_sessions``), the default. None of
them is written here: the options are the fields of
:class:`~rte.ipc.settings.Settings` and :class:`ServeOptions`, each with its
help and choices, read by :mod:`rte.ipc.sources`; a new setting is one field.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rte.cli.foreground import run_from_command_line
from rte.client import members_of
from rte.client.daemon import live_pid
from rte.errors import ConfigurationError
from rte.ipc.settings import Settings
from rte.ipc.sources import options_of, read, setting
from rte.launch import serve_command
from rte.launch.supervisor import Child, supervise
from rte.protocol.names import DaemonNames

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class ServeOptions:
    """What ``rte serve`` takes beyond a daemon's :class:`~rte.ipc.settings.Settings`."""

    replicas: int | None = setting(
        None,
        "run this many daemons, NAME-0 ... NAME-(N-1), supervised (restarted when "
        "they die); clients connect to NAME as one pool",
    )
    devices: str | None = setting(
        None, "one daemon per GPU: NAME-i on cuda:Di for --devices D0,D1,... (supervised)"
    )
    log_level: str = setting("info", "what the log says (with timestamps)", choices=LOG_LEVELS)


OPTIONS = (*options_of(Settings), *options_of(ServeOptions))


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the engine daemon in the foreground",
        description="Run the engine daemon until SIGTERM or Ctrl-C; clients connect by "
        "--name. Settings also come from RTE_* environment variables (RTE_MAX_SESSIONS) "
        "and a TOML file (--config); the command line wins, then the environment.",
    )
    p.add_argument("--config", type=Path, help="a TOML file of settings (max-sessions = 16)")
    for option in OPTIONS:
        option.add_to(p)
    p.set_defaults(func=run)


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """Every option's value: the command line's, else the environment's, else the
    config file's, else the default. ConfigurationError for a value that is not one."""
    return read(OPTIONS, vars(args), environ, args.config)


def run(args: argparse.Namespace) -> int:
    try:
        values = settings_from(args, dict(os.environ))
        level = values.pop("log_level")
        replicas, devices = values.pop("replicas"), values.pop("devices")
        settings = Settings(**values)
        children = _children(values, replicas, devices, level)
        _one_name_one_kind(settings.name, pool=bool(children))
    except ConfigurationError as exc:
        print(f"rte serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s rte serve %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if children:
        return supervise(children, ready=_say_own, say=_say_own)
    return run_from_command_line(settings)


def _say(line: str) -> None:
    """One line to stderr in one write (the children's echo threads write too)."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def _say_own(line: str) -> None:
    """The supervisor's own words, named as this command's."""
    _say(f"rte serve: {line}")


def _one_name_one_kind(name: str, pool: bool) -> None:
    """A pool NAME (NAME-0 ...) beside a daemon NAME, or the other way round, is
    refused: ``connect("NAME")`` would find the single daemon alone."""
    if pool and (pid := live_pid(DaemonNames(name))):
        raise ConfigurationError(
            f"a daemon named {name!r} runs (pid {pid}): connect({name!r}) would find it, "
            "not this pool; stop it, or give the pool another --name"
        )
    members = [m for m in members_of(name) if live_pid(DaemonNames(m))]
    if not pool and members:
        raise ConfigurationError(
            f"a pool named {name!r} runs ({', '.join(members)}): connect({name!r}) finds "
            "that pool; stop its supervisor, or give this daemon another --name"
        )


def _children(
    values: dict[str, Any], replicas: int | None, devices: str | None, level: str
) -> list[Child]:
    """The supervised daemons ``--replicas`` or ``--devices`` ask for (none: serve alone)."""
    if replicas is None and devices is None:
        return []
    if replicas is not None and devices is not None:
        raise ConfigurationError("--replicas and --devices: give one (--devices sets the count)")
    if devices is not None:
        try:
            ids = [int(d) for d in devices.split(",")]
        except ValueError:
            raise ConfigurationError(f"--devices {devices!r}: GPU indices, e.g. 0,1,2,3") from None
        places = [f"cuda:{d}" for d in ids]
    else:
        assert replicas is not None
        if replicas < 1:
            raise ConfigurationError(f"--replicas {replicas}: at least 1")
        places = [values["device"]] * replicas
    name = values["name"]
    children = []
    for i, place in enumerate(places):
        options = ["--log-level", level]
        port = values.get("metrics_port")
        own: dict[str, Any] = {"device": place}
        if port:  # a port each: child i on PORT + i (0: each its own free one)
            own["metrics_port"] = port + i
        for option in OPTIONS:
            if option.key in values and option.key != "name":  # (its own: serve_command's)
                options += option.argv(own.get(option.key, values[option.key]))
        children.append(Child(f"{name}-{i}", serve_command(f"{name}-{i}", options), _say))
    return children
