"""``rte serve``: run the engine daemon in the foreground until SIGTERM or Ctrl-C.

Every setting comes from, the first that has it winning: the command line, an
``RTE_*`` environment variable (``RTE_MAX_SESSIONS=16``), a TOML file named by
``--config`` (``max-sessions = 16``, or ``max_sessions``), the default.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rte.client import members_of
from rte.client.daemon import live_pid
from rte.errors import ConfigurationError
from rte.ipc.process import run_from_command_line
from rte.ipc.settings import Settings
from rte.ipc.supervisor import Child, supervise
from rte.models import model_choices
from rte.protocol.names import DaemonNames
from rte.protocol.requests import DEFAULT_CREDITS

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Option:
    name: str  # as on the command line, without the dashes
    type: Any
    default: Any
    help: str
    choices: tuple[str, ...] | None = None

    @property
    def key(self) -> str:
        return self.name.replace("-", "_")


OPTIONS = (
    Option("name", str, None, "the daemon's name (clients connect by it)"),
    Option("model", str, "reference", f"short name or module:factory; {model_choices()}"),
    Option(
        "device",
        str,
        None,
        "where the model computes: cpu, cuda or cuda:N (one daemon per GPU; "
        "default: the model's own choice)",
    ),
    Option("max-sessions", int, 8, "rows of the engine's arena"),
    Option(
        "engines",
        int,
        1,
        "engines of the model in this daemon, each of --max-sessions rows, sessions "
        "routed over them (for models that cannot batch)",
    ),
    Option("max-clients", int, 8, "client processes at once"),
    Option(
        "ring-kib",
        int,
        None,
        "each client ring's size (default: a step of every row, at least 256)",
    ),
    Option(
        "slab-slots",
        int,
        None,
        "chunks in flight in all (default: every client's quota, so that each may "
        "drive every session at full rate)",
    ),
    Option(
        "quota",
        int,
        0,
        "slots one client may hold (0: every row's credits plus one in flight, or an "
        "even share of --slab-slots)",
    ),
    Option(
        "credits",
        int,
        DEFAULT_CREDITS,
        "chunks a session may have emitted and not released before it waits for its "
        "client (a client may ask for others per attach)",
    ),
    Option("pace-hz", float, 0.0, "steps per second (0: flat out)"),
    Option(
        "admission",
        str,
        "realtime",
        "realtime: a paced daemon refuses an attach past the sessions its pace holds "
        "(measured); rows: only --max-sessions limits admission",
        ("realtime", "rows"),
    ),
    Option("realtime-margin", float, 0.1, "share of the period kept free at admission"),
    Option(
        "wait-policy",
        str,
        "spin-then-block",
        "how an idle daemon waits",
        ("spin", "spin-then-block", "block"),
    ),
    Option("idle-limit-s", float, 30.0, "detach the sessions of a stalled client"),
    Option(
        "metrics-port",
        int,
        None,
        "serve Prometheus metrics at http://127.0.0.1:PORT/metrics (0: any free port)",
    ),
    Option(
        "input-slots",
        int,
        None,
        "slots through which clients lend large inputs by reference (default "
        "max-sessions + 2 per client, at least 4; 0: none)",
    ),
    Option("input-slot-kib", int, 1024, "the largest input one input slot carries"),
    Option(
        "replicas",
        int,
        None,
        "run this many daemons, NAME-0 ... NAME-(N-1), supervised (restarted when "
        "they die); clients connect to NAME as one pool",
    ),
    Option(
        "devices",
        str,
        None,
        "one daemon per GPU: NAME-i on cuda:Di for --devices D0,D1,... (supervised)",
    ),
    Option("log-level", str, "info", "what the log says (with timestamps)", LOG_LEVELS),
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the engine daemon in the foreground",
        description="Run the engine daemon until SIGTERM or Ctrl-C; clients connect by "
        "--name. Settings also come from RTE_* environment variables (RTE_MAX_SESSIONS) "
        "and a TOML file (--config); the command line wins, then the environment.",
    )
    p.add_argument("--config", type=Path, help="a TOML file of settings (max-sessions = 16)")
    p.add_argument(
        "--model-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of the model's factory (repeatable; numbers and "
        "true/false are typed), e.g. --model-setting cost=2 for the world model",
    )
    for option in OPTIONS:
        default = f" (default {option.default})" if option.default not in (None, "") else ""
        p.add_argument(
            f"--{option.name}",
            type=option.type,
            default=None,
            choices=option.choices,
            help=option.help + default,
        )
    p.set_defaults(func=run)


def settings_from(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, Any]:
    """Every option's value: the command line's, else the environment's, else the
    config file's, else the default. ConfigurationError for a value that is not one."""
    values = {option.key: option.default for option in OPTIONS}
    values.update(_from_file(args.config) if args.config else {})
    for option in OPTIONS:
        raw = environ.get(f"RTE_{option.key.upper()}")
        if raw is not None:
            values[option.key] = _typed(option, raw, f"RTE_{option.key.upper()}")
        given = getattr(args, option.key)
        if given is not None:
            values[option.key] = given
    if not values["name"]:
        raise ConfigurationError("--name is required (or RTE_NAME, or name in --config)")
    values["model_settings"] = model_settings(getattr(args, "model_setting", []))
    return values


def model_settings(pairs: list[str]) -> dict[str, Any] | None:
    """``KEY=VALUE`` pairs as the model factory's keyword arguments (None: none)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigurationError(f"--model-setting {pair!r}: KEY=VALUE, KEY a Python name")
        out[key] = _scalar(raw)
    return out or None


def _scalar(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def _from_file(path: Path) -> dict[str, Any]:
    try:
        table = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"--config {path}: {exc}") from None
    known = {option.key: option for option in OPTIONS}
    values = {}
    for key, value in table.items():
        option = known.get(key.replace("-", "_"))
        if option is None:
            names = ", ".join(o.name for o in OPTIONS)
            raise ConfigurationError(f"--config {path}: unknown setting {key!r} (one of {names})")
        values[option.key] = _typed(option, value, f"--config {path}: {key}")
    return values


def _typed(option: Option, value: Any, where: str) -> Any:
    try:
        typed = option.type(value)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"{where}: {value!r} is not a valid {option.type.__name__}"
        ) from None
    if option.choices is not None and typed not in option.choices:
        raise ConfigurationError(f"{where}: {value!r} is not one of {', '.join(option.choices)}")
    return typed


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
        return supervise(children, lambda line: print(f"rte serve: {line}", file=sys.stderr))
    return run_from_command_line(settings)


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
        argv = [sys.executable, "-m", "rte", "serve", "--log-level", level]
        port = values.get("metrics_port")
        own = {"name": f"{name}-{i}", "device": place}
        if port:  # a port each: child i on PORT + i (0: each its own free one)
            own["metrics_port"] = port + i
        for option in OPTIONS:
            value = own.get(option.key, values.get(option.key))
            if value is not None and option.key in values:
                argv += [f"--{option.name}", str(value)]
        for key, value in (values.get("model_settings") or {}).items():
            argv += ["--model-setting", f"{key}={value}"]
        children.append(Child(f"{name}-{i}", argv))
    return children
