"""Settings written once: the command line, the environment and TOML drawn from fields.

A settings dataclass declares each field with :func:`setting`: its default,
its help, its choices and, when it differs from the field's name, its flag.
:func:`options_of` turns the fields into :class:`Option` s, and everything a
user can type follows from them, so adding a setting is one edit:

- the command line: ``--max-sessions N`` (argparse, with help, choices, type,
  and the default said in the help);
- the environment: ``RTE_MAX_SESSIONS=N``;
- a TOML file: ``max-sessions = N`` (or ``max_sessions``).

:func:`read` takes, for each setting, the first source that has it: the command
line, the environment, the file, the default. A value that is not one (of its
type, of its choices) is a :class:`~rte.errors.ConfigurationError` naming where
it came from. :meth:`Option.argv` is the inverse of the command line: what a
supervisor passes on to the daemons it starts.

A field whose value is a mapping (a model's own settings) is typed as
``KEY=VALUE`` pairs: a repeatable flag, a comma-separated variable, a TOML table.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rte.errors import ConfigurationError

METADATA = "rte.setting"  # the key of a field's metadata under which its Setting sits


@dataclass(frozen=True)
class Setting:
    """What a field says of itself to the command line, the environment and TOML."""

    help: str
    choices: tuple[str, ...] | None = None
    flag: str = ""  # without the dashes; "": the field's name, dashed


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    choices: tuple[str, ...] | None = None,
    flag: str = "",
) -> Any:
    """A dataclass field that is also an option (no default: a required one)."""
    return dataclasses.field(default=default, metadata={METADATA: Setting(help, choices, flag)})


@dataclass(frozen=True)
class Option:
    """One setting as the command line (``--flag``), the environment (``RTE_KEY``)
    and TOML (``flag-like-key``) spell it."""

    key: str  # the field's name
    flag: str  # on the command line, without the dashes
    type: type  # int, float, str; dict for KEY=VALUE pairs
    default: Any  # None when required
    help: str
    choices: tuple[str, ...] | None = None
    required: bool = False

    @property
    def name(self) -> str:
        """The flag, without the dashes."""
        return self.flag

    @property
    def env(self) -> str:
        return f"RTE_{self.key.upper()}"

    @property
    def toml(self) -> str:
        return self.key.replace("_", "-")

    @property
    def pairs(self) -> bool:
        return self.type is dict

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """``--flag`` on ``parser``; unset it is None, so that other sources count."""
        said = self.default not in (None, "") and not self.pairs
        text = self.help + (f" (default {self.default})" if said else "")
        if self.pairs:
            parser.add_argument(
                f"--{self.flag}", dest=self.key, action="append", metavar="KEY=VALUE", help=text
            )
            return
        parser.add_argument(
            f"--{self.flag}", dest=self.key, type=self.type, choices=self.choices, help=text
        )

    def given(self, value: Any) -> Any:
        """A value argparse parsed (the pairs still text) as the setting's value."""
        return pairs_of(value, f"--{self.flag}") if self.pairs else value

    def typed(self, value: Any, where: str) -> Any:
        """A value from the environment (text) or TOML (typed), as the setting's."""
        if self.pairs:
            if isinstance(value, str):
                return pairs_of([p for p in value.split(",") if p.strip()], where)
            if isinstance(value, Mapping):
                return pairs_of([f"{k}={v}" for k, v in value.items()], where) and dict(value)
            raise ConfigurationError(f"{where}: {value!r} is not KEY=VALUE pairs (TOML: a table)")
        try:
            typed = self.type(value)
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"{where}: {value!r} is not a valid {self.type.__name__}"
            ) from None
        if self.choices is not None and typed not in self.choices:
            raise ConfigurationError(f"{where}: {value!r} is not one of {', '.join(self.choices)}")
        return typed

    def text(self, value: Any) -> str:
        """``value`` as the environment spells it (``typed`` reads it back)."""
        if self.pairs:
            return ",".join(f"{k}={v}" for k, v in value.items())
        return str(value)

    def argv(self, value: Any) -> list[str]:
        """``value`` as the command line spells it (nothing for None)."""
        if value is None:
            return []
        if self.pairs:
            return [word for k, v in value.items() for word in (f"--{self.flag}", f"{k}={v}")]
        return [f"--{self.flag}", self.text(value)]


def options_of(cls: type) -> tuple[Option, ...]:
    """The options of dataclass ``cls``'s fields declared with :func:`setting`."""
    hints = typing.get_type_hints(cls)
    options = []
    for f in dataclasses.fields(cls):
        said = f.metadata.get(METADATA)
        if said is None:
            continue
        required = f.default is dataclasses.MISSING
        options.append(
            Option(
                key=f.name,
                flag=said.flag or f.name.replace("_", "-"),
                type=_scalar_type(hints[f.name], f.name),
                default=None if required else f.default,
                help=said.help,
                choices=said.choices,
                required=required,
            )
        )
    return tuple(options)


def _scalar_type(hint: Any, key: str) -> type:
    """``int`` of ``int | None``; ``dict`` of a mapping's hint."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(h for h in typing.get_args(hint) if h is not type(None))
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return dict
    if origin in (int, float, str):
        return typing.cast(type, origin)
    raise TypeError(f"setting {key!r}: no command line for a {hint!r}")  # a bug of ours


def read(
    options: tuple[Option, ...],
    given: Mapping[str, Any],
    environ: Mapping[str, str],
    config: Path | None = None,
) -> dict[str, Any]:
    """Every option's value: the command line's (``given``: argparse's, None when
    not given), else the environment's, else the ``config`` file's, else the
    default. ConfigurationError for a value that is not one, or a required one missing."""
    values = {option.key: option.default for option in options}
    if config is not None:
        values.update(from_toml(options, config))
    for option in options:
        raw = environ.get(option.env)
        if raw is not None:
            values[option.key] = option.typed(raw, option.env)
        if given.get(option.key) is not None:
            values[option.key] = option.given(given[option.key])
    for option in options:
        if option.required and not values[option.key]:
            raise ConfigurationError(
                f"--{option.flag} is required (or {option.env}, or {option.toml} in --config)"
            )
    return values


def from_toml(options: tuple[Option, ...], path: Path) -> dict[str, Any]:
    """The settings of TOML file ``path`` (``max-sessions`` or ``max_sessions``)."""
    try:
        table = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"--config {path}: {exc}") from None
    known = {option.key: option for option in options}
    values = {}
    for key, value in table.items():
        option = known.get(key.replace("-", "_"))
        if option is None:
            names = ", ".join(o.toml for o in options)
            raise ConfigurationError(f"--config {path}: unknown setting {key!r} (one of {names})")
        values[option.key] = option.typed(value, f"--config {path}: {key}")
    return values


def pairs_of(pairs: list[str], where: str = "--model-setting") -> dict[str, Any] | None:
    """``KEY=VALUE`` pairs as keyword arguments, numbers and true/false typed (None: none)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.strip().partition("=")
        if not sep or not key.isidentifier():
            raise ConfigurationError(f"{where} {pair!r}: KEY=VALUE, KEY a Python name")
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
