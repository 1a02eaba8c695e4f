"""ClientCore: what every client does, with no waiting in it.

The one place of a client's behaviour, whatever its transport
(:mod:`rte.client.transport`) and whoever waits (the sync
:class:`~rte.client.base.EngineClient` blocks, the asyncio
:class:`~rte.client.aio.AsyncClient` sleeps on its loop):

- **requests**: checks a call's arguments (:mod:`rte.client.arguments`) and
  numbers its request (never 0: that answers nothing);
- **answers**: a waiting call notes which notices end it (:meth:`ClientCore.expect`);
  the engine answers ATTACH, RESET and DETACH with notices that carry their seq,
  and the call returns or raises on its final one (:meth:`ClientCore.answer`);
- **sorting**: what a transport received goes to the batch queue, to the
  answers, or to the notices nobody waits for (an action refused, an idle
  detach, an engine-wide error), and keeps the attached sessions;
- **handing out**: a step's batch whole (``poll_batch``), or a chunk at a time
  (``poll``: :class:`Chunk` s made on demand over the same batches);
- **held counts**: rows handed out and not yet released; a release counts,
  then the transport gives the rows back.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rte.client import arguments
from rte.client.batch import ChunkBatch
from rte.client.transport import Arrival, Gone
from rte.contract import Action, Manifest, Notice, NoticeKind, Timing
from rte.errors import AdmissionError, ClientClosedError, RequestError, RequestTimeout
from rte.protocol.requests import Act, Attach, Detach, Reset

Call = Attach | Reset | Detach  # the requests a caller waits on
GiveBack = Callable[[ChunkBatch, np.ndarray[Any, Any]], None]

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


class ClientCore:
    """One client's state over one transport; every method returns at once.

    Attributes:
        name: the engine's name.
        manifest: what the engine promises.
        sessions: the sessions attached and not yet seen leave.
        closed: whether the client was closed.
    """

    def __init__(self, name: str, manifest: Manifest, give_back: GiveBack) -> None:
        self.name = name
        self.manifest = manifest
        self.sessions: set[str] = set()
        self.closed = False
        self._give_back = give_back
        self._seq = 0
        self._notices: collections.deque[Notice] = collections.deque()
        self._replies: dict[int, Notice] = {}
        self._waiting: dict[int, frozenset[NoticeKind]] = {}
        self._batches: collections.deque[ChunkBatch] = collections.deque()
        self._cursor = 0  # rows of the first batch already handed out by take_chunk
        self._held = 0  # rows handed out and not yet released

    # -- requests -------------------------------------------------------------

    def next_seq(self) -> int:
        self._seq = self._seq % 0xFFFFFFFF + 1  # never 0: that answers nothing
        return self._seq

    def attach(
        self, session: str, conditioning: Mapping[str, Any] | None, credits: int, priority: int
    ) -> Attach:
        """The checked, numbered request of an attach."""
        session, credits = arguments.session(session), arguments.credits(credits)
        cond = dict(arguments.conditioning(conditioning, "attach") or {})
        self.check_open()
        return Attach(session, cond, self.next_seq(), credits, priority)

    def act(self, session: str, conditioning: Mapping[str, Any]) -> Act:
        session = arguments.session(session)
        cond = arguments.conditioning(conditioning, "act", required=True) or {}
        self.check_open()
        return Act(session, Action(dict(cond)), self.next_seq())

    def reset(self, session: str, conditioning: Mapping[str, Any] | None) -> Reset:
        session = arguments.session(session)
        cond = arguments.conditioning(conditioning, "reset")
        self.check_open()
        return Reset(session, None if cond is None else dict(cond), self.next_seq())

    def detach(self, session: str) -> Detach:
        session = arguments.session(session)
        self.check_open()
        return Detach(session, seq=self.next_seq())

    def check_open(self) -> None:
        if self.closed:
            raise ClientClosedError(f"this client of {self.name!r} is closed; connect again")

    # -- answers --------------------------------------------------------------

    def expect(self, request: Call) -> int:
        """Before sending a call's request: note which answers end it."""
        self.check_open()
        self._waiting[request.seq] = _FINAL[type(request)]
        return request.seq

    def answered(self, seq: int) -> bool:
        return seq in self._replies

    def forget(self, seq: int) -> None:
        """The call of ``seq`` ended (answered or not): later answers are news."""
        self._waiting.pop(seq, None)

    def answer(self, seq: int) -> None:
        """A call's final answer came: return, or raise what it says."""
        reply = self._replies.pop(seq)
        if reply.kind is NoticeKind.REJECTED:
            raise AdmissionError(reply.message)
        if reply.kind is NoticeKind.ERROR:
            raise RequestError(reply.message)

    def unanswered(self, request: Call, timeout: float) -> RequestTimeout:
        return RequestTimeout(
            f"{self.name!r} did not answer {type(request).__name__.lower()} "
            f"{request.session!r} in {timeout}s"
        )

    # -- arrivals -------------------------------------------------------------

    def sort(self, arrivals: list[Arrival]) -> None:
        """Whatever a transport received, into batches, answers and notices."""
        for item in arrivals:
            if isinstance(item, ChunkBatch):
                self._batches.append(item)
                continue
            if isinstance(item, Gone):
                self.sessions.discard(item.session)
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

    def has_chunks(self) -> bool:
        return bool(self._batches)

    def take_batch(self) -> ChunkBatch:
        """The next batch (what poll left of it); only when :meth:`has_chunks`."""
        batch = self._batches.popleft()
        if self._cursor:
            batch, self._cursor = batch.tail(self._cursor), 0
        self._held += len(batch)
        return batch

    def take_chunk(self) -> Chunk:
        """The next chunk, as its own object; only when :meth:`has_chunks`."""
        batch, i = self._batches[0], self._cursor
        self._cursor += 1
        if self._cursor == len(batch):
            self._batches.popleft()
            self._cursor = 0
        self._held += 1
        return Chunk(
            batch.sessions[i],
            batch.chunk_index(i),
            batch.latents[i],
            batch.timing(i),
            _release_row,
            (batch, i),
            batch.applied_of(i),
        )

    def drain_notices(self) -> list[Notice]:
        out = list(self._notices)
        self._notices.clear()
        return out

    # -- held counts ----------------------------------------------------------

    def held(self) -> int:
        """Chunks handed out and not yet released."""
        return self._held

    def release_rows(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        """What every batch calls on release: count, then the transport gives back."""
        if not self.closed:  # closed: the engine took everything back
            self._held -= len(rows)
            self._give_back(batch, rows)

    def close(self) -> bool:
        """Forget every batch and session; True the first time (the caller leaves)."""
        if self.closed:
            return False
        self.closed = True
        self._batches.clear()
        self._held = 0
        self.sessions.clear()
        return True


def _release_row(chunk: Chunk) -> None:
    batch, row = chunk.lease
    batch.release_row(row)
