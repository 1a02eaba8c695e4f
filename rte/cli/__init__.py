"""The ``rte`` command: thin subcommands over the engine, the daemon and the tools.

rte serve       run the engine daemon (the product)
rte demo        launch a daemon, stream sessions from a client, show rates
rte play        play a model in a browser: a page on 127.0.0.1, one session per tab
rte inspect     read live daemons' rings, slab and counters
rte drain       move every session off a daemon to its pool's others, then stop it
rte record      drive a daemon's session with scripted moves, record its trace
rte replay      make a recorded session again, report the first chunk that differs
rte clean       remove what a dead daemon left in /dev/shm
rte bench       the benchmarks of a source checkout (tools/)

A mistake is one line on stderr and a non-zero exit (2 for settings that
cannot hold, 130 for Ctrl-C, at any moment, the imports included); ``--debug``
shows the traceback instead. A closed stdout (``rte inspect | head``) is a
quiet end, exit 0. The commands are imported inside :func:`main`, so that its
Ctrl-C handling covers their imports too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, NoReturn

import rte


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a mistake on the command line is one line, not the usage block,
    and an option is never taken from a prefix of its name (``--max-session`` is a
    mistake, not ``--max-sessions``: a typo must not set an option the user did not
    name). Every subcommand's parser is one of these (argparse makes them of the
    parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    """The ``rte`` command; its exit code. A Ctrl-C even while the commands are
    still being imported (NumPy's import takes a while) is one line and 130."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # the commands' own handler is not set up yet
        print("rte: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # a reader that closed its end (rte inspect | head): done
        _quiet_stdout()
        return 0


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's flush at exit finds the pipe
    closed too, and would say so (``Exception ignored ... BrokenPipeError``)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT held off while the commands are imported: a Ctrl-C in the middle of a C
    extension's import (NumPy's) would surface there as an ImportError with a
    traceback, not as a KeyboardInterrupt; held, it is raised once they are whole."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _main(argv: list[str] | None) -> int:
    with _sigint_held():
        from rte.cli import (  # noqa: PLC0415
            bench,
            clean,
            demo,
            drain,
            inspect,
            play,
            record,
            replay,
            serve,
        )
        from rte.errors import ConfigurationError  # noqa: PLC0415

    parser = OneLineParser(prog="rte", description="A realtime inference engine.")
    parser.add_argument("--version", action="version", version=f"rte {rte.__version__}")
    parser.add_argument("--debug", "-v", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (serve, demo, play, inspect, drain, record, replay, clean, bench):
        command.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"rte {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout's reader closed its end: a normal end, said by main
        raise
    except Exception as exc:
        if args.debug:
            raise
        print(f"rte {args.command}: {one_line(exc)}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigurationError) else 1


def one_line(exc: BaseException) -> str:
    """An error as a user reads it: what went wrong, on one line. Errors of rte and
    of the system say it themselves; anything else is a bug, named as one."""
    from rte.errors import RteError  # noqa: PLC0415 (imported once a command runs)
    from shm import ShmError  # noqa: PLC0415

    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, RteError | ShmError | OSError | ValueError):
        return text
    return f"{type(exc).__name__}: {text} (a bug: run with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
