"""EngineClient: the one interface a caller uses, in process or over shared memory.

After vLLM's ``EngineCoreClient`` with its ``InprocClient`` / ``MPClient``: the
behaviour lives here once (request numbering, waiting for an answer, sorting
what arrives into chunks, answers and notices, the held-chunk count, close), and
each form supplies only its transport in four methods: ``_send`` a request,
``_receive`` what arrived, ``_give_back`` released rows, ``_shutdown``. So a
behaviour test written against this interface runs unchanged on both forms.

Chunks arrive a step at a time, as a :class:`~rte.client.batch.ChunkBatch`
per step (``poll_batch``: no Python object per chunk); ``poll`` and
``results`` hand out the same batches a chunk at a time, for convenience.

Requests carry a sequence number; the engine answers ATTACH, RESET and
DETACH with notices that carry it, and a waiting call returns (or raises) on
its final answer. Every other notice (an action refused, an idle detach, an
engine-wide error) waits in :meth:`EngineClient.notices`.
"""

from __future__ import annotations

import abc
import collections
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np

from rte.client import arguments
from rte.client.batch import ChunkBatch
from rte.client.inputs import InputLoan, loan_layout
from rte.contract import Action, Manifest, Notice, NoticeKind, Timing
from rte.errors import AdmissionError, ClientClosedError, RequestError, RequestTimeout
from rte.overload import DEFAULT_PRIORITY
from rte.protocol.requests import Act, Attach, Detach, Request, Reset

R = TypeVar("R", bound=Request)
ADMISSION_RETRY_S = 0.05  # how often attach(wait=...) asks again

_FINAL = {  # the notices that answer each waiting call
    Attach: frozenset({NoticeKind.ATTACHED, NoticeKind.REJECTED, NoticeKind.ERROR}),
    Reset: frozenset({NoticeKind.ATTACHED, NoticeKind.REJECTED, NoticeKind.ERROR}),
    Detach: frozenset({NoticeKind.DETACHED, NoticeKind.ERROR}),
}


def until_admitted(attempt: Callable[[], object], wait: float) -> None:
    """``attempt()`` an attach, again every :data:`ADMISSION_RETRY_S` while it raises
    AdmissionError, for up to ``wait`` seconds (then that AdmissionError)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            attempt()
            return
        except AdmissionError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(ADMISSION_RETRY_S, left))


class Chunk:
    """One chunk of one session.

    ``latent`` is read-only; over shared memory it is a view of the slab slot
    the engine wrote it into, valid until :meth:`release` (or the end of a
    ``with`` block), after which the slot may be reused. Release every chunk:
    a client that holds its whole quota stalls its own sessions.
    """

    __slots__ = ("_release", "applied", "chunk", "latent", "lease", "session", "timing")

    def __init__(
        self,
        session: str,
        chunk: int,
        latent: np.ndarray[Any, Any],
        timing: Timing,
        release: Callable[[Chunk], None],
        lease: Any = None,
        applied: int = 0,
    ) -> None:
        self.applied = applied  # the seq of the last action it reflects (0: none)
        self.session = session
        self.chunk = chunk
        self.latent = latent
        self.timing = timing
        self.lease = lease  # (batch, row): the step batch the chunk is a row of
        self._release: Callable[[Chunk], None] | None = release

    def release(self) -> None:
        """Hand the chunk's memory back to the engine (idempotent)."""
        release, self._release = self._release, None
        if release is not None:
            release(self)

    @property
    def released(self) -> bool:
        return self._release is None

    def __enter__(self) -> Chunk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"Chunk({self.session!r}, chunk={self.chunk}, {self.latent.dtype}{self.latent.shape})"
        )


class EngineClient(abc.ABC):
    """A caller's connection to one engine. Not thread-safe: use it from one thread.

    Attributes:
        name: the engine's name (the daemon's, or ``"in-process"``).
        manifest: what the engine promises (shape and dtype of every chunk...).
        sessions: the sessions this client has attached and not yet seen leave.
    """

    def __init__(self, name: str, manifest: Manifest) -> None:
        self.name = name
        self.manifest = manifest
        self.sessions: set[str] = set()
        self._seq = 0
        self._notices: collections.deque[Notice] = collections.deque()
        self._replies: dict[int, Notice] = {}
        self._waiting: dict[int, frozenset[NoticeKind]] = {}
        self._batches: collections.deque[ChunkBatch] = collections.deque()
        self._cursor = 0  # rows of the first batch already handed out by poll
        self._held = 0  # rows handed out and not yet released
        self._closed = False

    # -- transport (what each form supplies) ---------------------------------

    @abc.abstractmethod
    def _send(self, request: Request, timeout: float) -> None:
        """Hand one request to the engine, waiting up to ``timeout`` s for room."""

    @abc.abstractmethod
    def _receive(self, timeout: float) -> list[ChunkBatch | Notice]:
        """What the engine sent, waiting up to ``timeout`` s for something ([] if nothing)."""

    @abc.abstractmethod
    def _give_back(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        """Rows of ``batch`` (indices into its lease) were released: hand their memory back."""

    @abc.abstractmethod
    def _shutdown(self) -> None:
        """Leave the engine: give back every chunk and what the client holds."""

    # -- waiting on an event loop (what each form supplies for rte.client.aio) --

    @abc.abstractmethod
    def _wake_fd(self) -> int:
        """The file descriptor that turns readable when :meth:`_arm` asked for a wake-up."""

    @abc.abstractmethod
    def _arm(self) -> bool:
        """Announce a sleep on :meth:`_wake_fd`; True (and no sleep) when
        something arrived already. Call :meth:`_disarm` after the sleep."""

    @abc.abstractmethod
    def _disarm(self) -> bool:
        """End a sleep: take the wake-ups; False when the engine's side is gone."""

    @abc.abstractmethod
    def _check_live(self, alive: bool = True) -> None:
        """EngineGone when the engine stopped or died (``alive`` False: its side
        of the wake-up closed, so it did)."""

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
    ) -> None:
        """Attach a session. AdmissionError at capacity (rows, or the sessions a paced
        engine holds in real time), RequestError if refused, RequestTimeout
        without an answer in ``timeout`` s.

        ``credits``: how many of its chunks may be emitted and not yet released
        before the session waits for this client (1 to 255; 0: the engine's
        default). Fewer credits, less latency from an action to the chunk that
        shows it; more, more slack for a consumer that releases late.
        ``priority``: its class under overload, 0 (highest) to 3 (default 1): the
        lowest class present is stepped at a reduced rate first.
        ``wait``: seconds to keep asking while the engine is at capacity (the
        AdmissionError comes once they have passed).
        """
        session, credits = arguments.session(session), arguments.credits(credits)
        conditioning = arguments.conditioning(conditioning, "attach")
        timeout, wait = arguments.timeout(timeout), arguments.timeout(wait, "wait")
        cond = dict(conditioning or {})
        until_admitted(
            lambda: self._call(Attach(session, cond, self._next_seq(), credits, priority), timeout),
            wait,
        )

    def act(self, session: str, conditioning: Mapping[str, Any], *, timeout: float = 1.0) -> int:
        """Send an action; it applies at the session's next step. Does not wait
        for an answer: a refusal arrives later as a notice (see :meth:`notices`).
        Returns its ``seq``: each chunk's ``applied`` names the last one it reflects.

        A large array (a frame, an image) travels by reference, not through the
        ring: one from :meth:`loan` as it is, any other of 64 KiB or more copied
        once into a slot of the daemon's input slab (see :mod:`rte.client.inputs`).
        Do not change an array after sending it in process: the engine reads it.
        """
        session, timeout = arguments.session(session), arguments.timeout(timeout)
        conditioning = arguments.conditioning(conditioning, "act", required=True) or {}
        self._check_open()
        request = self._lend(Act(session, Action(dict(conditioning)), self._next_seq()), timeout)
        self._send_lent(request, timeout)
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
        self._check_open()
        shape, dtype, _ = loan_layout(shape, dtype)  # RequestError for one no form can lend
        return InputLoan(np.empty(shape, dtype), None)

    def _lend(self, request: R, timeout: float) -> R:
        """``request`` with its large arrays sent by reference (its form's way)."""
        return request

    def _unlend(self, request: Request) -> None:  # noqa: B027 (in process: nothing was taken)
        """``request`` was not sent: what :meth:`_lend` took for it goes back."""

    def _send_lent(self, request: Request, timeout: float) -> None:
        try:
            self._send(request, timeout)
        except BaseException:
            self._unlend(request)
            raise

    def reset(
        self, session: str, conditioning: Mapping[str, Any] | None = None, *, timeout: float = 5.0
    ) -> None:
        """Restart the session from chunk 0, with new conditioning or its last.
        A refused reset (RequestError) leaves the session as it was."""
        session, timeout = arguments.session(session), arguments.timeout(timeout)
        conditioning = arguments.conditioning(conditioning, "reset")
        fresh = None if conditioning is None else dict(conditioning)
        self._call(Reset(session, fresh, self._next_seq()), timeout)

    def detach(self, session: str, *, timeout: float = 5.0) -> None:
        """Detach a session; its in-flight chunk still arrives (before this returns,
        if it fits the client's quota; else a DROPPED notice says so)."""
        session, timeout = arguments.session(session), arguments.timeout(timeout)
        self._call(Detach(session, seq=self._next_seq()), timeout)

    # -- results --------------------------------------------------------------

    def poll_batch(self, timeout: float = 1.0) -> ChunkBatch | None:
        """The next step's chunks as one batch, waiting up to ``timeout`` s; None if
        none came. Release it (``release()`` or a ``with`` block) when done."""
        if not self._wait_for_chunks(timeout):
            return None
        batch = self._batches.popleft()
        if self._cursor:
            batch, self._cursor = batch.tail(self._cursor), 0
        self._held += len(batch)
        return batch

    def poll(self, timeout: float = 1.0) -> Chunk | None:
        """The next chunk, waiting up to ``timeout`` s; None if none came."""
        if not self._wait_for_chunks(timeout):
            return None
        batch, i = self._batches[0], self._cursor
        self._cursor += 1
        if self._cursor == len(batch):
            self._batches.popleft()
            self._cursor = 0
        self._held += 1
        latent = batch.latents[i]
        return Chunk(
            batch.sessions[i],
            batch.chunk_index(i),
            latent,
            batch.timing(i),
            _release_row,
            (batch, i),
            batch.applied_of(i),
        )

    def _wait_for_chunks(self, timeout: float) -> bool:
        timeout = arguments.timeout(timeout)
        self._check_open()
        if not self._batches:
            deadline = time.monotonic() + timeout
            self._pump(timeout)
            while not self._batches:  # only notices came: keep waiting for a chunk
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._pump(left)
        return True

    def results(self, timeout: float = 1.0) -> Iterator[Chunk]:
        """Chunks as they come; stops after ``timeout`` s without one."""
        while (chunk := self.poll(timeout)) is not None:
            yield chunk

    def notices(self) -> list[Notice]:
        """Drain the notices that were not answers to a waiting call (refused
        actions, idle detaches, dropped chunks, engine-wide errors)."""
        self._check_open()
        self._pump(0.0)
        out = list(self._notices)
        self._notices.clear()
        return out

    def held(self) -> int:
        """Chunks handed out by poll/results/poll_batch and not yet released."""
        return self._held

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Detach every session, release every chunk, leave the engine (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._batches.clear()
        self._held = 0
        self.sessions.clear()
        self._shutdown()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq = self._seq % 0xFFFFFFFF + 1  # never 0: that answers nothing
        return self._seq

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"this client of {self.name!r} is closed; connect again")

    def _call(self, request: Attach | Reset | Detach, timeout: float) -> None:
        """Send a request and wait for its final answer."""
        seq = self._expect(request)
        deadline = time.monotonic() + timeout
        try:
            self._send_lent(self._lend(request, timeout), timeout)
            while seq not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._unanswered(request, timeout)
                self._pump(left)
        finally:
            del self._waiting[seq]
        self._answer(seq)

    # The steps of a call, shared with the asyncio form (rte.client.aio).

    def _expect(self, request: Attach | Reset | Detach) -> int:
        """Before sending a call's request: note which answers end it."""
        self._check_open()
        self._waiting[request.seq] = _FINAL[type(request)]
        return request.seq

    def _unanswered(self, request: Attach | Reset | Detach, timeout: float) -> RequestTimeout:
        return RequestTimeout(
            f"{self.name!r} did not answer {type(request).__name__.lower()} "
            f"{request.session!r} in {timeout}s"
        )

    def _answer(self, seq: int) -> None:
        """A call's final answer came: return, or raise what it says."""
        reply = self._replies.pop(seq)
        if reply.kind is NoticeKind.REJECTED:
            raise AdmissionError(reply.message)
        if reply.kind is NoticeKind.ERROR:
            raise RequestError(reply.message)

    def _pump(self, timeout: float) -> None:
        """Sort whatever arrives (waiting up to ``timeout`` s) into chunks, answers, notices."""
        for item in self._receive(timeout):
            if isinstance(item, ChunkBatch):
                self._batches.append(item)
                continue
            if item.kind is NoticeKind.ATTACHED:
                self.sessions.add(item.session)
            elif item.kind is NoticeKind.DETACHED:
                self.sessions.discard(item.session)
            final = self._waiting.get(item.seq) if item.seq else None
            if final is None:
                self._notices.append(item)  # nobody waits for it: news
            elif item.kind in final:
                self._replies[item.seq] = item
            # else: a step of the call being waited on (the DETACHED of a RESET)

    def _release_rows(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        """What every batch calls on release: count, then the transport gives back."""
        if not self._closed:  # closed: the engine took everything back
            self._held -= len(rows)
            self._give_back(batch, rows)


def _release_row(chunk: Chunk) -> None:
    batch, row = chunk.lease
    batch.release_row(row)
