"""Transport: what a client form supplies beneath the one client core.

After vLLM's ``EngineCoreClient`` with its ``InprocClient`` / ``MPClient``: the
behaviour lives once, in :class:`~rte.client.core.ClientCore` (numbering,
expected answers, sorting arrivals, the batch queue, held counts), and each
way of reaching an engine is a :class:`Transport` that moves requests and
arrivals without waiting for them: over a daemon's shared memory
(:class:`~rte.client.shm.ShmTransport`), to an engine on a thread of this
process (:class:`~rte.client.inprocess.InProcessTransport`), or over several
daemons at once (:class:`~rte.client.pool.PoolTransport`).

Waiting is the caller's: the sync client (:class:`~rte.client.base.EngineClient`)
blocks in :meth:`Transport.wait`; the asyncio client
(:class:`~rte.client.aio.AsyncClient`) announces a sleep with :meth:`Transport.arm`,
watches :meth:`Transport.wake_fds` with ``loop.add_reader`` and ends it with
:meth:`Transport.disarm`. So every transport plugs into both.

A transport hands its arrivals up as chunk batches (released through the
core's callback, which counts them and gives their rows back here), notices,
and :class:`Gone` markers for sessions it lost without a word from their
engine (a pool member that died).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rte.client.batch import ChunkBatch, Release
from rte.client.inputs import InputLoan
from rte.contract import Manifest, Notice
from rte.errors import RequestError
from rte.protocol.requests import Export, Request, StateBox
from rte.state import SessionState


@dataclass(frozen=True)
class Gone:
    """Session ``session`` is no longer attached: its engine died (the notice
    that says so comes with it). Counted by the core, never handed out."""

    session: str


Arrival = ChunkBatch | Notice | Gone
Numbering = Callable[[], int]  # the core's next request number


class Transport(abc.ABC):
    """One way to reach an engine. Not thread-safe: one client uses it.

    Attributes:
        name: the engine's name (a daemon's, ``"in-process"``, a pool's).
        manifest: what the engine promises.
        closed: whether :meth:`close` ran (or the transport gave up for good).
    """

    name: str
    manifest: Manifest
    closed: bool = False

    def number_with(self, numbering: Numbering) -> None:  # noqa: B027 (most need no numbers)
        """Requests the transport makes itself (a pool's reattach) take their
        numbers from ``numbering``, the core's, so no answer is mistaken."""

    # -- requests out ---------------------------------------------------------

    @abc.abstractmethod
    def send(self, request: Request, room_s: float = 0.0) -> None:
        """Hand over one request; waits for room up to ``room_s`` (0: not at all;
        RequestTimeout when there is none). WireError (a RequestError) for one
        that cannot be sent; EngineGone when the engine cannot be reached."""

    @abc.abstractmethod
    def loan(self, shape: tuple[int, ...], dtype: Any, timeout: float) -> InputLoan:
        """A buffer for a large input (see :meth:`EngineClient.loan`)."""

    def lend(self, request: Request, timeout: float) -> Request:
        """``request`` with its large arrays sent by reference (its form's way)."""
        return request

    def unlend(self, request: Request) -> None:  # noqa: B027 (nothing was taken)
        """``request`` was not sent: what :meth:`lend` took for it goes back."""

    def export_into(self, request: Export, timeout: float) -> Export:
        """``request`` with where its state goes (here: a box the loop of this
        process fills with the state itself)."""
        return dataclasses.replace(request, into=StateBox())

    def exported(self, request: Export, nbytes: int) -> SessionState:
        """The state an EXPORTED answer to ``request`` handed over."""
        box = request.into
        if not isinstance(box, StateBox) or box.state is None:
            raise RequestError(f"export of {request.session!r}: no state was handed over")
        return box.state

    def export_done(self, request: Export) -> None:  # noqa: B027 (nothing was taken)
        """What :meth:`export_into` took for ``request`` goes back."""

    # -- arrivals in ----------------------------------------------------------

    @abc.abstractmethod
    def receive(self, release: Release) -> list[Arrival]:
        """What arrived, at once ([] if nothing); each batch is released through
        ``release`` (the core's count, then :meth:`give_back`)."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` s until something may be received; True if so.
        EngineGone when the engine died meanwhile."""

    @abc.abstractmethod
    def give_back(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        """Rows of ``batch`` (indices into its lease) were released: their memory goes back."""

    # -- waiting on an event loop -------------------------------------------

    @abc.abstractmethod
    def wake_fds(self) -> list[int]:
        """The descriptors that turn readable when :meth:`arm` asked for a wake-up."""

    @abc.abstractmethod
    def arm(self) -> bool:
        """Announce a sleep on :meth:`wake_fds`; True when something arrived already
        (then no sleep was announced). After a sleep, call :meth:`disarm`."""

    @abc.abstractmethod
    def disarm(self) -> bool:
        """End a sleep: take the wake-ups; False when the engine's side is gone."""

    @abc.abstractmethod
    def check_live(self, alive: bool = True) -> None:
        """EngineGone when the engine stopped or died (``alive`` False: its side of
        the wake-up closed, so it did)."""

    # -- leaving --------------------------------------------------------------

    @abc.abstractmethod
    def close(self) -> None:
        """Leave the engine: every chunk and what the client holds go back (idempotent)."""
