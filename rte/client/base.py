"""EngineClient: the one interface a caller uses, in process or over shared memory.

After vLLM's ``EngineCoreClient`` with its ``InprocClient`` / ``MPClient``: the
behaviour lives here once (request numbering, waiting for an answer, sorting
what arrives into chunks, answers and notices, the held-chunk count, close), and
each form supplies only its transport in three methods: ``_send`` a request,
``_receive`` what arrived, ``_shutdown``. So a behaviour test written against
this interface runs unchanged on both forms.

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
from typing import Any

import numpy as np

from rte.contract import Action, Manifest, Notice, NoticeKind, Timing
from rte.errors import AdmissionError, ClientClosedError, RequestError, RequestTimeout
from rte.serve import Act, Attach, Detach, Request, Reset

_FINAL = {  # the notices that answer each waiting call
    Attach: frozenset({NoticeKind.ATTACHED, NoticeKind.REJECTED, NoticeKind.ERROR}),
    Reset: frozenset({NoticeKind.ATTACHED, NoticeKind.REJECTED, NoticeKind.ERROR}),
    Detach: frozenset({NoticeKind.DETACHED, NoticeKind.ERROR}),
}


class Chunk:
    """One chunk of one session.

    ``latent`` is read-only; over shared memory it is a view of the slab slot
    the engine wrote it into, valid until :meth:`release` (or the end of a
    ``with`` block), after which the slot may be reused. Release every chunk:
    a client that holds its whole quota stalls its own sessions.
    """

    __slots__ = ("_release", "chunk", "latent", "lease", "session", "timing")

    def __init__(
        self,
        session: str,
        chunk: int,
        latent: np.ndarray[Any, Any],
        timing: Timing,
        release: Callable[[Chunk], None],
        lease: Any = None,
    ) -> None:
        self.session = session
        self.chunk = chunk
        self.latent = latent
        self.timing = timing
        self.lease = lease  # the transport's hold on the chunk's memory (a slab sample)
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
        self._chunks: collections.deque[Chunk] = collections.deque()
        self._notices: collections.deque[Notice] = collections.deque()
        self._replies: dict[int, Notice] = {}
        self._waiting: dict[int, frozenset[NoticeKind]] = {}
        self._held: set[Chunk] = set()
        self._closed = False

    # -- transport (what each form supplies) ---------------------------------

    @abc.abstractmethod
    def _send(self, request: Request, timeout: float) -> None:
        """Hand one request to the engine, waiting up to ``timeout`` s for room."""

    @abc.abstractmethod
    def _receive(self, timeout: float) -> list[Chunk | Notice]:
        """What the engine sent, waiting up to ``timeout`` s for something ([] if nothing)."""

    @abc.abstractmethod
    def _shutdown(self) -> None:
        """Leave the engine: give back every chunk and what the client holds."""

    # -- sessions -------------------------------------------------------------

    def attach(
        self, session: str, conditioning: Mapping[str, Any] | None = None, *, timeout: float = 5.0
    ) -> None:
        """Attach a session. AdmissionError at capacity, RequestError if refused,
        RequestTimeout without an answer in ``timeout`` s."""
        self._call(Attach(session, dict(conditioning or {}), self._next_seq()), timeout)

    def act(self, session: str, conditioning: Mapping[str, Any], *, timeout: float = 1.0) -> None:
        """Send an action; it applies at the session's next step. Does not wait
        for an answer: a refusal arrives later as a notice (see :meth:`notices`)."""
        self._check_open()
        self._send(Act(session, Action(dict(conditioning)), self._next_seq()), timeout)

    def reset(
        self, session: str, conditioning: Mapping[str, Any] | None = None, *, timeout: float = 5.0
    ) -> None:
        """Restart the session from chunk 0, with new conditioning or its last.
        A refused reset (RequestError) leaves the session as it was."""
        fresh = None if conditioning is None else dict(conditioning)
        self._call(Reset(session, fresh, self._next_seq()), timeout)

    def detach(self, session: str, *, timeout: float = 5.0) -> None:
        """Detach a session; its in-flight chunk still arrives (before this returns,
        if it fits the client's quota; else a DROPPED notice says so)."""
        self._call(Detach(session, seq=self._next_seq()), timeout)

    # -- results --------------------------------------------------------------

    def poll(self, timeout: float = 1.0) -> Chunk | None:
        """The next chunk, waiting up to ``timeout`` s; None if none came."""
        self._check_open()
        if not self._chunks:
            deadline = time.monotonic() + timeout
            self._pump(timeout)
            while not self._chunks:  # only notices came: keep waiting for a chunk
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._pump(left)
        chunk = self._chunks.popleft()
        self._held.add(chunk)
        return chunk

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
        """Chunks handed out by poll/results and not yet released."""
        return len(self._held)

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Detach every session, release every chunk, leave the engine (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._chunks.clear()
        self._held.clear()
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
        self._check_open()
        seq = request.seq
        self._waiting[seq] = _FINAL[type(request)]
        deadline = time.monotonic() + timeout
        try:
            self._send(request, timeout)
            while seq not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeout(
                        f"{self.name!r} did not answer {type(request).__name__.lower()} "
                        f"{request.session!r} in {timeout}s"
                    )
                self._pump(left)
        finally:
            del self._waiting[seq]
        reply = self._replies.pop(seq)
        if reply.kind is NoticeKind.REJECTED:
            raise AdmissionError(reply.message)
        if reply.kind is NoticeKind.ERROR:
            raise RequestError(reply.message)

    def _pump(self, timeout: float) -> None:
        """Sort whatever arrives (waiting up to ``timeout`` s) into chunks, answers, notices."""
        for item in self._receive(timeout):
            if isinstance(item, Chunk):
                self._chunks.append(item)
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

    def _released(self, chunk: Chunk) -> None:
        """A chunk of ours was released: no longer held."""
        self._held.discard(chunk)
