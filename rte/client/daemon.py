"""The daemon a shm client talks to: finding it, and what its transport's
errors mean to the caller.

:func:`open_control` finds a live daemon's control segment: at once (no
daemon of that name, or a dead one's leftovers, is EngineGone saying how to
start one) or, asked to, waiting (bounded) for one to come up; :func:`meaning`
is the one place an ``shm`` exception becomes an :mod:`rte.errors` class.
"""

from __future__ import annotations

import time

from rte.errors import EngineGone, RequestTimeout, RteError, WireError
from rte.protocol.control import KIND_CONTROL
from rte.protocol.names import DaemonNames
from shm import (
    ForeignSegmentError,
    RecordTooLarge,
    Segment,
    SegmentError,
    SegmentNotFoundError,
    SegmentVersionError,
    ShmError,
    WouldBlock,
)


def meaning(exc: ShmError, doing: str) -> RteError:
    """The one place a transport error becomes what it means to a caller: the
    daemon does not take requests (RequestTimeout), this request cannot be sent
    (WireError), or the daemon cannot be reached at all (EngineGone)."""
    if isinstance(exc, WouldBlock):
        return RequestTimeout(f"{doing}: the daemon is not taking requests ({exc})")
    if isinstance(exc, RecordTooLarge):
        return WireError(f"{doing}: {exc}")
    return EngineGone(f"{doing}: {exc}")


def open_control(names: DaemonNames, deadline: float, *, wait: bool = True) -> Segment:
    """The live daemon's control segment.

    ``wait``: until ``deadline`` for one to appear (a daemon being launched, or
    one replacing a dead one's leftovers). Without it, no segment of that name,
    or one whose creator is dead, is EngineGone at once; only a segment still
    being written (a daemon starting this instant) is waited for, until ``deadline``.
    """
    while True:
        try:
            segment = Segment.open(names.control, kind=KIND_CONTROL, readonly=True)
            if segment.creator_alive():
                return segment
            segment.close()  # a dead daemon's leftovers: a new one may be replacing them
            problem = (
                f"daemon {names.daemon!r} is dead (its pid {segment.creator_pid} is gone); "
                f"start it again with: rte serve --name {names.daemon} (it replaces what "
                f"the dead one left), or remove that with: rte clean {names.daemon}"
            )
            final = not wait
        except SegmentVersionError as exc:  # waiting will not help
            raise EngineGone(str(exc)) from None
        except SegmentNotFoundError:
            problem = (
                f"no daemon named {names.daemon!r}{' came up in time' if wait else ''}"
                f"{running_ones()}; start one with: rte serve --name {names.daemon}"
                + ("" if wait else " (or give a timeout to wait for one)")
            )
            final = not wait
        except ForeignSegmentError as exc:  # or still being written by a daemon starting
            problem, final = str(exc), False
        except SegmentError as exc:  # another user's, say: waiting will not help
            raise EngineGone(str(exc)) from None
        if final or time.monotonic() >= deadline:
            raise EngineGone(problem)
        time.sleep(0.02)


def running_ones() -> str:
    """`` (running: a, b)``, the daemons of this user with a control segment, or
    `` (none is running)``: for an error about a name that is not one of them."""
    present = [n.daemon for n in DaemonNames.present() if live_pid(n)]
    return f" (running: {', '.join(present)})" if present else " (none is running)"


def live_pid(names: DaemonNames) -> int | None:
    """The pid of the live daemon of these names; None when there is none."""
    try:
        segment = Segment.open(names.control, kind=KIND_CONTROL, readonly=True)
    except ShmError:
        return None
    try:
        return segment.creator_pid if segment.creator_alive() else None
    finally:
        segment.close()
