"""Execution lanes: HOT, DEFERRED and ENCODE, and the interface a step body drives.

A lane is where a stage's work runs. One step body drives every kind of lanes
through the small interface of :class:`Lanes`: ``run`` a stage on a lane,
``mark`` a point on a lane and make another lane ``wait`` for it,
``submit_encode`` for asynchronous encodes, ``publish`` (or ``host_wait`` on a
DEFERRED marker) to make DEFERRED output visible to the host, and ``drain``
before any failure propagates. The kinds
are :class:`~rte.lanes.cpu.CpuLanes` (inline, ENCODE on a worker thread) and
:class:`~rte.lanes.cuda.CudaLanes` (a stream per lane, over a backend of
streams and events: torch's, :mod:`rte.lanes.torch`, or the simulated device,
:mod:`rte.lanes.sim`); :func:`rte.lanes.make_lanes` chooses one.

This module is the bottom of the package: every other module of it imports
this one and nothing imports them back, so the backends are no longer a cycle.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Lane(enum.Enum):
    HOT = "hot"  # the critical path: makes the latent
    DEFERRED = "deferred"  # decodes chunk N-1 while HOT makes chunk N
    ENCODE = "encode"  # on-demand: heavy conditioning of the rows whose key changed


class Completion(Protocol):
    """An asynchronous encode: ``done`` never blocks; ``result`` waits and re-raises."""

    def done(self) -> bool: ...

    def result(self) -> None: ...


class Lanes:
    """The interface the step body uses; :class:`CpuLanes` and :class:`CudaLanes` fill it."""

    kind = "none"

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def device(self) -> str:
        """Where the lanes' work runs: ``cpu``, ``cuda:N``, or ``sim`` (simulated CUDA)."""
        return "cpu"

    @property
    def current(self) -> Lane | None:
        """The lane the calling thread is running a stage on, if any (for tracing)."""
        return getattr(self._local, "lane", None)

    @contextmanager
    def _on(self, lane: Lane) -> Iterator[None]:
        previous = self.current
        self._local.lane = lane
        try:
            yield
        finally:
            self._local.lane = previous

    def run(self, lane: Lane, fn: Callable[[Any], object], arg: Any) -> None:
        raise NotImplementedError

    def mark(self, lane: Lane) -> object:
        """A point on ``lane`` that another lane can wait for (None on the CPU)."""
        return None

    def wait(self, lane: Lane, marker: object) -> None:
        """Make later work on ``lane`` start after ``marker`` (no-op on the CPU)."""

    def hand_over(self, value: object, to: Lane) -> None:
        """Tell the allocator that ``value``, made on one lane, is used on ``to``."""

    def publish(self) -> None:
        """Block until DEFERRED output written so far is visible to the host."""

    def host_wait(self, marker: object) -> None:
        """Block until the work before ``marker`` is done (no-op on the CPU: it is)."""

    def handed_out(self, batches: list[Any]) -> None:
        """The host hands out ``batches``' frames now. The simulated device checks
        that the DEFERRED work writing them was waited for; elsewhere a no-op."""

    def submit_encode(self, fn: Callable[[Any], object], arg: Any) -> Completion:
        raise NotImplementedError

    def drain(self) -> None:
        """Wait until every lane is idle (before a failure propagates, before a detach)."""

    def close(self) -> None:
        """Release lane resources; outstanding encodes are waited for first."""

    def output_allocator(self, manifest: Any) -> Any:
        """The allocator an engine on these lanes writes chunks with when it is given
        none (None: the heap's); on CUDA, page-locked blocks."""
        return None


class LanesFault(RuntimeError):
    """The device failed and stays failed (a sticky CUDA error): nothing more can
    run on these lanes. The engine fails closed on it."""
