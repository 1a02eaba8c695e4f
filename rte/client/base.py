"""EngineClient: the one interface a caller uses, blocking, over any transport.

The sync client is the :class:`~rte.client.core.ClientCore` (numbering,
answers, sorting, the batch queue, held counts) plus blocking waits: it sends
through its :class:`~rte.client.transport.Transport` (waiting for room up to a
call's timeout), blocks in :meth:`Transport.wait` until something arrives, and
has the core sort it. :class:`~rte.client.shm.ShmClient`,
:class:`~rte.client.inprocess.InProcessClient` and
:class:`~rte.client.pool.PoolClient` are this class over their transports; the
asyncio form (:mod:`rte.client.aio`) is the same core over the same transports.

Chunks arrive a step at a time, as a :class:`~rte.client.batch.ChunkBatch`
per step (``poll_batch``: no Python object per chunk); ``poll`` and
``results`` hand out the same batches a chunk at a time, for convenience.
A call that waits (attach, reset, detach) returns or raises on the engine's
final answer; every other notice waits in :meth:`EngineClient.notices`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rte.client import arguments
from rte.client.batch import ChunkBatch
from rte.client.core import ADMISSION_RETRY_S, AdmissionRetry, Call, Chunk, ClientCore
from rte.client.inputs import InputLoan
from rte.client.transport import LateExports, Transport
from rte.contract import Manifest, Notice
from rte.errors import AdmissionError, RequestTimeout
from rte.overload import DEFAULT_PRIORITY
from rte.protocol.requests import Export, Request
from rte.state import SessionState

__all__ = ["ADMISSION_RETRY_S", "Chunk", "EngineClient", "until_admitted"]


def until_admitted(attempt: Callable[[], object], wait: float) -> None:
    """``attempt()`` an attach, again every :data:`ADMISSION_RETRY_S` while it raises
    AdmissionError, for up to ``wait`` seconds (then that AdmissionError)."""
    retry = AdmissionRetry(wait)
    while True:
        try:
            attempt()
            return
        except AdmissionError as refusal:
            time.sleep(retry.pause(refusal))


class EngineClient:
    """A caller's connection to one engine. Not thread-safe: use it from one thread.

    Attributes:
        name: the engine's name (the daemon's, ``"in-process"``, a pool's).
        manifest: what the engine promises (shape and dtype of every chunk...).
        sessions: the sessions this client has attached and not yet seen leave.
        transport: how it reaches the engine.
        stranded: session -> its state, for one that left and no engine took back
            (an export given up on, carried out late, then refused on attaching
            again; a drained session every daemon refused): attach it with
            ``attach(s, state=client.stranded.pop(s))``.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._core = core = ClientCore(transport.name, transport.manifest, transport.give_back)
        transport.number_with(core.next_seq)
        self.name: str = transport.name
        self.manifest: Manifest = transport.manifest
        self.sessions: set[str] = core.sessions
        self.stranded: dict[str, SessionState] = {}
        self._late = LateExports(core, transport, self.stranded)  # exports given up on

    # -- sessions -------------------------------------------------------------

    def attach(
        self,
        session: str,
        conditioning: Mapping[str, Any] | None = None,
        *,
        credits: int = 0,
        timeout: float = 5.0,
        priority: int = DEFAULT_PRIORITY,
        wait: float = 0.0,
        state: SessionState | None = None,
    ) -> None:
        """Attach a session. AdmissionError at capacity (rows, or the sessions a paced
        engine holds in real time), RequestError if refused, RequestTimeout
        without an answer in ``timeout`` s.

        ``credits``: how many of its chunks may be emitted and not yet released
        before the session waits for this client (1 to 255; 0: the engine's
        default). For a consumer slower than the engine, fewer credits, less
        latency from an action to the chunk that shows it (fewer chunks queue
        ahead of it); more, more slack for a consumer that releases late. One
        credit makes every step wait for the release of the chunk before, so a
        consumer that releases at once is served best by the default.
        ``priority``: its class under overload, 0 (highest) to 3 (default 1): the
        lowest class present is stepped at a reduced rate first.
        ``wait``: seconds to keep asking while the engine is at capacity (the
        AdmissionError comes once they have passed).
        ``state``: move the session in with a state exported or checkpointed
        elsewhere (a :class:`~rte.SessionState` of this id; no ``conditioning``: it
        carries its own): it goes on at its next chunk index, its frames those
        of a session never moved. Its bytes travel as a large input (through a
        daemon's input slab); RequestError for a state of another model or version.
        """
        core = self._core
        timeout, wait = arguments.timeout(timeout), arguments.timeout(wait, "wait")
        until_admitted(
            lambda: self._call(
                core.attach(session, conditioning, credits, priority, state), timeout
            ),
            wait,
        )

    def suspend(self, session: str, *, timeout: float = 5.0) -> None:
        """Park a session: its row is freed, its state kept in the engine's host
        memory, its id still this client's; no chunk comes until :meth:`resume`.
        AdmissionError past the host's park budget (it stays attached, streaming),
        RequestError for a model that exports no state or a session not attached."""
        self._call(self._core.suspend(session), arguments.timeout(timeout))

    def resume(self, session: str, *, timeout: float = 5.0) -> None:
        """Bring a suspended session back: it goes on at its next chunk index, its
        frames those of a session never suspended. AdmissionError while no row is
        free (it stays parked: retry), RequestError for one not suspended."""
        self._call(self._core.resume(session), arguments.timeout(timeout))

    def export(self, session: str, *, timeout: float = 5.0) -> SessionState:
        """Hand a session's state over and let it go, to move it to another engine
        (``attach(s, state=...)`` there: it goes on at its next chunk index, its
        frames the twin's). A daemon writes the state into a slot of this client's
        input segment, never through the ring. RequestError (it stays as it was)
        for a state bigger than an input slot, a model that exports no state or a
        session not attached. RequestTimeout when no answer came in ``timeout``
        s: the engine may still carry it out, and the session is then attached
        again where it was, going on as if never exported (its slot stays lent
        until then: :class:`~rte.client.transport.LateExports`)."""
        timeout = arguments.timeout(timeout)
        transport = self.transport
        if session in self._late:  # (before its slot: the session may be on its way back)
            self._after_late(session, time.monotonic() + timeout, timeout)
        request = transport.export_into(self._core.export(session), timeout)
        try:
            answer = self._call(request, timeout)
            return transport.exported(request, int(answer.message or 0))
        finally:
            if not self._late.keeps(request):
                transport.export_done(request)

    def act(self, session: str, conditioning: Mapping[str, Any], *, timeout: float = 1.0) -> int:
        """Send an action; it applies at the session's next step. Does not wait
        for an answer: a refusal arrives later as a notice (see :meth:`notices`).
        Returns its ``seq``: each chunk's ``applied`` names the last one it reflects.

        A large array (a frame, an image) travels by reference, not through the
        ring: one from :meth:`loan` as it is, any other of 64 KiB or more copied
        once into a slot of the daemon's input slab (see :mod:`rte.client.inputs`).
        Do not change an array after sending it in process: the engine reads it.
        """
        request = self._core.act(session, conditioning)
        timeout = arguments.timeout(timeout)
        if self._late.by_session and self._late.hold(request):
            return request.seq  # (its session's export given up on: sent once it ended)
        self._send(self.transport.lend(request, timeout), timeout)
        return request.seq

    def loan(self, shape: tuple[int, ...], dtype: Any, *, timeout: float = 1.0) -> InputLoan:
        """A buffer for a large input, to fill in place and send by reference:

            with client.loan((512, 512, 3), "uint8") as frame:
                camera.read_into(frame)
                client.act("alice", {"frame": frame})

        Over shared memory it is a slot of the daemon's input slab, this
        client's until sent (leaving the block unsent gives it back); it waits
        up to ``timeout`` s for the client's input quota (RequestTimeout).
        """
        self._core.check_open()
        return self.transport.loan(shape, dtype, timeout)

    def reset(
        self, session: str, conditioning: Mapping[str, Any] | None = None, *, timeout: float = 5.0
    ) -> None:
        """Restart the session from chunk 0, with new conditioning or its last.
        A refused reset (RequestError) leaves the session as it was."""
        request = self._core.reset(session, conditioning)
        self._call(request, arguments.timeout(timeout))

    def detach(self, session: str, *, timeout: float = 5.0) -> None:
        """Detach a session; its in-flight chunk still arrives (before this returns,
        if it fits the client's quota; else a DROPPED notice says so)."""
        request = self._core.detach(session)
        self._call(request, arguments.timeout(timeout))

    # -- results --------------------------------------------------------------

    def poll_batch(self, timeout: float = 1.0) -> ChunkBatch | None:
        """The next step's chunks as one batch, waiting up to ``timeout`` s; None if
        none came. Release it (``release()`` or a ``with`` block) when done."""
        if not self._wait_for_chunks(timeout):
            return None
        return self._core.take_batch()

    def poll(self, timeout: float = 1.0) -> Chunk | None:
        """The next chunk, waiting up to ``timeout`` s; None if none came."""
        if timeout.__class__ is not float or not 0.0 <= timeout <= arguments.MAX_TIMEOUT_S:
            timeout = arguments.timeout(timeout)  # (the fast path: a plain float in range)
        chunk = self._core.next_chunk()  # one of a step already here: no wait, no pump
        if chunk is not None or not self._wait_for_chunks(timeout):
            return chunk
        return self._core.take_chunk()

    def results(self, timeout: float = 1.0) -> Iterator[Chunk]:
        """Chunks as they come; stops after ``timeout`` s without one."""
        while (chunk := self.poll(timeout)) is not None:
            yield chunk

    def notices(self) -> list[Notice]:
        """Drain the notices that were not answers to a waiting call (refused
        actions, idle detaches, dropped chunks, engine-wide errors)."""
        self._core.check_open()
        self._pump(0.0)
        return self._core.drain_notices()

    def held(self) -> int:
        """Chunks handed out by poll/results/poll_batch and not yet released."""
        return self._core.held()

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Detach every session, release every chunk, leave the engine (idempotent)."""
        if self._core.close():
            self.transport.close()

    @property
    def closed(self) -> bool:
        return self._core.closed

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the blocking waits -----------------------------------------------------

    def _wait_for_chunks(self, timeout: float) -> bool:
        timeout = arguments.timeout(timeout)
        core = self._core
        core.check_open()
        if core.has_chunks():
            return True
        deadline = time.monotonic() + timeout
        self._pump(timeout)
        while not core.has_chunks():  # only notices came: keep waiting for a chunk
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._pump(left)
        return True

    def _pump(self, timeout: float) -> None:
        """Give back what chunks released, then sort whatever arrives (waiting up
        to ``timeout`` s for something)."""
        transport = self.transport
        self._core.flush()
        if timeout <= 0 or transport.wait(timeout):
            self._core.sort(transport.receive(self._core.release_rows))
        if self._late.by_session:  # (an attach again that found no room: tried again too)
            self._late.settle()

    def _send(self, request: Request, timeout: float) -> None:
        """Send a lent request; one that could not be sent gives back what it was lent."""
        try:
            self.transport.send(request, timeout)
        except BaseException:
            self.transport.unlend(request)
            raise

    def _call(self, request: Call, timeout: float) -> Notice:
        """Send a request and wait for its final answer (returned). A call on a
        session whose export was given up on waits for that export's end first."""
        core = self._core
        deadline = time.monotonic() + timeout
        if request.session in self._late:
            self._after_late(request.session, deadline, timeout)
        seq = core.expect(request)
        try:
            self._send(self.transport.lend(request, timeout), timeout)
            while not core.answered(seq):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._pump(left)
        finally:
            core.forget(seq)
        if not core.answered(seq):
            raise self._unanswered(request, timeout)
        return core.answer(seq)

    def _unanswered(self, request: Call, timeout: float) -> RequestTimeout:
        """What a call sent and never answered raises (an export's is kept late)."""
        if isinstance(request, Export):
            home = self.transport.home_of(request.session)
            return self._late.give_up(request, home, timeout).error
        return self._core.unanswered(request, timeout)

    def _after_late(self, session: str, deadline: float, timeout: float) -> None:
        """Wait until ``session``'s export given up on ended (attached again, or
        refused); RequestTimeout past ``deadline``."""
        while session in self._late:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RequestTimeout(
                    f"{self.name!r}: an export of {session!r} given up on earlier has not "
                    f"ended in {timeout}s (the engine has not come round); nothing was sent"
                )
            self._pump(left)
