"""``rte drain NAME``: move every session off a daemon to its pool's others, then
(``--stop``) stop it, with no session lost: for a restart or an upgrade.

    rte drain gpu-0                  drain gpu-0, wait until it holds no session
    rte drain gpu-0 --timeout 60     ... for at most 60 s (then exit 1, naming them)
    rte drain gpu-0 --stop           ... then stop it (under rte serve --replicas,
                                     its supervisor starts it again, afresh)

The command connects to NAME as a client and sends DRAIN
(:mod:`rte.protocol.drain`). The daemon (:mod:`rte.ipc.draining`) refuses
every new attach from then on (a pool places it on another member), and tells
each client, once per session, that its session is to move: a pool client
moves it to the pool's other daemons (:mod:`rte.client.migration`: no gap, no
repeat in its chunk indices), a plain client cannot and only sees the notice.
The command waits, reading the daemon's control block alone, until the
daemon holds no session, or the timeout: then it exits 1 naming the sessions
still there and their clients (one a plain client holds stays until its
client detaches it). Draining a daemon that drains already is the same wait.
The timeout holds against a daemon that stopped answering (SIGSTOP, a
step that never ends): the command then says so, with its heartbeat's age.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import time
from typing import Any

from rte.client import replicas_of
from rte.client.daemon import meaning, running_ones
from rte.client.shm import ShmTransport
from rte.contract import Notice, NoticeKind
from rte.errors import EngineGone, RequestTimeout, RteError
from rte.ipc.inspect import daemons
from rte.protocol.drain import Drain, DrainReport
from rte.protocol.wire import encode_request
from shm import ShmError, is_alive

ANSWER_TIMEOUT_S = 5.0  # the daemon answers a DRAIN at its next turn (within --timeout)
LIST_TIMEOUT_S = 1.0  # past the timeout: the most the names of what stays are waited for
WATCH_EVERY_S = 0.05  # how often the sessions it holds are read while waiting
STOP_TIMEOUT_S = 30.0  # a stopped daemon's grace to finalize and exit


class DrainTimeout(RteError):
    """The daemon still held sessions when the drain's timeout passed."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "drain",
        help="move every session off a daemon to its pool's others (then --stop it)",
        description="Drain daemon NAME: it takes no new session and tells each client to "
        "move its sessions (a pool client moves them to the pool's other daemons); wait "
        "until it holds none, then, with --stop, stop it (under rte serve --replicas, its "
        "supervisor starts it again). Exit 1 if sessions remain after the timeout.",
    )
    p.add_argument("name", help="the daemon to drain (a pool's member: NAME-i)")
    p.add_argument(
        "--timeout", type=_seconds, default=30.0, help="seconds to wait for it to empty (30)"
    )
    p.add_argument("--stop", action="store_true", help="stop the daemon once it is empty")
    p.set_defaults(func=run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def run(args: argparse.Namespace) -> int:
    name = args.name
    if name not in daemons():
        members = replicas_of(name)
        if members:
            raise RteError(
                f"{name} is a pool of {len(members)} daemons ({', '.join(members)}): "
                f"drain one of them (rte drain {members[0]})"
            )
        raise EngineGone(f"no daemon named {name!r}{running_ones()}")
    transport = ShmTransport(name)  # EngineGone for a dead one's leftovers
    began = time.monotonic()
    try:
        pid, start = transport.control.segment.creator_pid, transport.control.segment.creator_start
        report = _ask(transport, 1, min(ANSWER_TIMEOUT_S, args.timeout))
        if report.already:
            wait = f"waiting for its {_sessions(report.held)}" if report.held else "it is empty"
            print(f"{name} is draining already (for {report.since_s:.1f} s): {wait}")
        else:
            print(f"draining {name}: {_sessions(report.held)} to move, no new session taken")
        left = _wait_empty(transport, began + args.timeout)
        if left:
            try:
                final = _ask(transport, 2, LIST_TIMEOUT_S)
            except RequestTimeout:  # frozen meanwhile: the count alone
                raise DrainTimeout(
                    f"{name}: {_sessions(left)} still there after {args.timeout:g} s, and it "
                    f"did not answer for their names ({_heartbeat(transport)}); it takes no "
                    "new session"
                ) from None
            raise DrainTimeout(
                f"{name}: {_sessions(final.held)} still there after {args.timeout:g} s: "
                f"{final.listing()}; their clients did not move them (a plain client "
                "cannot: detach them, or connect through the pool); it takes no new session"
            )
    finally:
        transport.close()
    print(f"{name} drained: {_sessions(report.held)} left it in {time.monotonic() - began:.2f} s")
    if args.stop:
        _stop(name, pid, start)
    return 0


def _sessions(n: int) -> str:
    return f"{n} session{'' if n == 1 else 's'}"


def _heartbeat(transport: ShmTransport) -> str:
    """How long ago the daemon last beat, for a message about its silence."""
    age = transport.control.heartbeat_age_s
    return f"its heartbeat is {age:.1f} s old: stopped (SIGSTOP) or stuck in a step?"


def _ask(transport: ShmTransport, seq: int, timeout: float) -> DrainReport:
    """Send DRAIN numbered ``seq``; the daemon's report within ``timeout`` seconds.
    RequestTimeout without one, saying how long the daemon has been silent."""
    deadline = time.monotonic() + timeout
    try:
        transport.inbox.push(encode_request(Drain(seq)), timeout, transport.slot.check)
    except ShmError as exc:
        raise meaning(exc, f"asking {transport.name!r} to drain") from None
    while True:
        for item in transport.receive(_nothing):
            if isinstance(item, Notice) and item.seq == seq:
                if item.kind is not NoticeKind.DRAINING:  # a daemon of before rte drain
                    raise RteError(f"{transport.name!r} refused to drain: {item.message}")
                return DrainReport.from_message(item.message)
        left = deadline - time.monotonic()
        if left <= 0:
            raise RequestTimeout(
                f"{transport.name!r} did not answer DRAIN in {timeout:g} s "
                f"({_heartbeat(transport)}); if it runs again it may still drain "
                f"(rte inspect {transport.name} shows it)"
            )
        transport.wait(min(left, WATCH_EVERY_S))


def _wait_empty(transport: ShmTransport, deadline: float) -> int:
    """Until the daemon holds no session, or ``deadline``; the sessions it holds
    then. What reaches this client meanwhile (engine-wide news) is read and let go."""
    control = transport.control
    while (held := control.held) and time.monotonic() < deadline:
        transport.slot.check()  # EngineGone if the daemon stopped or died meanwhile
        transport.receive(_nothing)
        time.sleep(WATCH_EVERY_S)
    return held


def _stop(name: str, pid: int, start: float) -> None:
    """SIGTERM to the drained daemon, then wait for it to be gone."""
    if not is_alive(pid, start):
        raise EngineGone(f"{name} (pid {pid}) is gone already")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while is_alive(pid, start):
        if time.monotonic() > deadline:
            raise RteError(f"{name} (pid {pid}) did not stop in {STOP_TIMEOUT_S:g} s of SIGTERM")
        time.sleep(WATCH_EVERY_S)
    print(f"{name} stopped (pid {pid}): no session lost")


def _nothing(batch: object, rows: object) -> None:
    """What a chunk's release would do: this client has no session, so none comes."""
