"""The daemon a shm client talks to: finding it, and what its transport's
errors mean to the caller.

:func:`open_control` waits (bounded) for a live daemon's control segment,
telling a dead daemon's leftovers from one still starting; :func:`meaning`
is the one place an ``shm`` exception becomes an :mod:`rte.errors` class.
"""

from __future__ import annotations

import time

from rte.errors import EngineGone, RequestTimeout, RteError, WireError
from rte.ipc.control import KIND_CONTROL
from rte.ipc.names import DaemonNames
from shm import (
    RecordTooLarge,
    Segment,
    SegmentError,
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


def open_control(names: DaemonNames, deadline: float) -> Segment:
    """The live daemon's control segment, waiting until ``deadline`` for one."""
    while True:
        try:
            segment = Segment.open(names.control, kind=KIND_CONTROL)
            if segment.creator_alive():
                return segment
            segment.close()  # a dead daemon's leftovers: a new one may be replacing them
            problem = f"daemon {names.daemon!r} is dead (its pid {segment.creator_pid} is gone)"
        except SegmentVersionError as exc:  # waiting will not help
            raise EngineGone(str(exc)) from None
        except SegmentError:  # absent, or still being made
            problem = (
                f"no daemon named {names.daemon!r} (start one with: rte serve --name "
                f"{names.daemon})"
            )
        if time.monotonic() >= deadline:
            raise EngineGone(problem)
        time.sleep(0.02)
