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

from rte.errors import ConfigurationError
from rte.ipc.process import run_from_command_line
from rte.ipc.settings import Settings
from rte.serve import DEFAULT_CREDITS

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
    Option("model", str, "reference", "short name or module:factory"),
    Option(
        "device",
        str,
        None,
        "where the model computes: cpu, cuda or cuda:N (one daemon per GPU; "
        "default: the model's own choice)",
    ),
    Option("max-sessions", int, 8, "rows of the engine's arena"),
    Option("max-clients", int, 8, "client processes at once"),
    Option("ring-kib", int, 256, "each client ring's size"),
    Option("slab-slots", int, 64, "chunks in flight in all"),
    Option("quota", int, 0, "slots per client (0: an even share)"),
    Option(
        "credits",
        int,
        DEFAULT_CREDITS,
        "chunks a session may have emitted and not released before it waits for its "
        f"client (default {DEFAULT_CREDITS}; a client may ask for others per attach)",
    ),
    Option("pace-hz", float, 0.0, "steps per second (0: flat out)"),
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
        "slots through which clients lend large inputs by reference (default 4 per "
        "client; 0: none)",
    ),
    Option("input-slot-kib", int, 1024, "the largest input one input slot carries"),
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
    return values


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
        settings = Settings(**values)
    except ConfigurationError as exc:
        print(f"rte serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s rte serve %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    return run_from_command_line(settings)
