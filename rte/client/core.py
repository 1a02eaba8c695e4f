"""ClientCore: what every client does, with no waiting in it.

The one place of a client's behaviour, whatever its transport
(:mod:`rte.client.transport`) and whoever waits (the sync
:class:`~rte.client.base.EngineClient` blocks, the asyncio
:class:`~rte.client.aio.AsyncClient` sleeps on its loop):

- **requests**: checks a call's arguments (:mod:`rte.client.arguments`) and
  numbers its request (never 0: that answers nothing);
- **answers**: a waiting call notes which notices end it (:meth:`ClientCore.expect`);
  the engine answers ATTACH, RESET, DETACH, SUSPEND and RESUME with notices that
  carry their seq,
  and the call returns or raises on its final one (:meth:`ClientCore.answer`);
  an export given up on is expected still, its answer :attr:`ClientCore.late`'s;
- **sorting**: what a transport received goes to the batch queue, to the
  answers, or to the notices nobody waits for (an action refused, an idle
  detach, an engine-wide error), and keeps the attached sessions;
- **handing out**: a step's batch whole (``poll_batch``), or a chunk at a time
  (``poll``: a :class:`Chunk` is a row of the same batches, its fields read
  from the batch when asked);
- **held counts**: rows handed out and not yet released; a release counts,
  then the transport gives the rows back.

The per-chunk API costs what the batch API costs: a chunk's release counts at
once but only marks its row (:meth:`ChunkBatch.defer_row`); the marked rows of
a batch go back to the transport in one call when the batch's last row is
released, else before the core hands out the next step (:meth:`ClientCore.take_chunk`
at a batch's first row, :meth:`ClientCore.take_batch`) or its caller waits or
receives (:meth:`ClientCore.flush`). So the transport's give back (one C call,
the credits, the doorbell) runs per step, and a released chunk's slot and
credit are back before the engine could need them for a chunk this client
would see. A caller whose other tasks release while it sleeps (asyncio) sets
:attr:`ClientCore.eager`: releases then go back at once, as nobody would flush.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rte.client import arguments
from rte.client.batch import ChunkBatch
from rte.client.transport import Arrival, Gone, LateExports
from rte.contract import Action, Manifest, Notice, NoticeKind, Timing
from rte.errors import AdmissionError, ClientClosedError, RequestError, RequestTimeout
from rte.protocol.requests import (
    Act,
    Attach,
    Detach,
    Export,
    Reset,
    Resume,
    Suspend,
    with_state,
)
from rte.state import SessionState

Call = Attach | Reset | Detach | Suspend | Resume | Export  # the requests a caller waits on
GiveBack = Callable[[ChunkBatch, np.ndarray[Any, Any]], None]
ADMISSION_RETRY_S = 0.05  # how often attach(wait=...) asks again

_FINAL = {  # the notices that answer each waiting call
    Attach: frozenset({NoticeKind.ATTACHED, NoticeKind.REJECTED, NoticeKind.ERROR}),
    Reset: frozenset({NoticeKind.ATTACHED, NoticeKind.REJECTED, NoticeKind.ERROR}),
    Detach: frozenset({NoticeKind.DETACHED, NoticeKind.ERROR}),
    Suspend: frozenset({NoticeKind.SUSPENDED, NoticeKind.REJECTED, NoticeKind.ERROR}),
    Resume: frozenset({NoticeKind.RESUMED, NoticeKind.REJECTED, NoticeKind.ERROR}),
    Export: frozenset({NoticeKind.EXPORTED, NoticeKind.REJECTED, NoticeKind.ERROR}),
}


class AdmissionRetry:
    """``attach(wait=...)``'s schedule, the same for the client that sleeps and the
    one that awaits: ask again every :data:`ADMISSION_RETRY_S` while refused for
    capacity, until ``wait`` seconds have passed."""

    def __init__(self, wait: float) -> None:
        self._deadline = time.monotonic() + wait

    def pause(self, refusal: AdmissionError) -> float:
        """Seconds to pause before the next attempt; ``refusal`` itself once the
        wait has passed."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise refusal
        return min(ADMISSION_RETRY_S, left)


class Chunk:
    """One chunk of one session: row ``row`` of a step's :class:`ChunkBatch`.

    ``latent`` is read-only; over shared memory it is a view of the slab slot
    the engine wrote it into, valid until :meth:`release` (or the end of a
    ``with`` block), after which the slot may be reused. Release every chunk:
    a client that holds its whole quota stalls its own sessions.

    Attributes (read from the batch when asked, nothing made before):
        session: its session.
        chunk: its index in the session's stream.
        latent: its latent (a read-only view).
        timing: its timestamps.
        applied: the seq of the last action it reflects (0: none).
        lease: ``(batch, row)``: the step batch the chunk is a row of.
    """

    __slots__ = ("_batch", "_core", "_latent", "_row")

    def __init__(self, batch: ChunkBatch, row: int, core: ClientCore | None) -> None:
        self._batch = batch
        self._row = row
        self._core = core  # None once released
        self._latent: np.ndarray[Any, Any] | None = None

    @property
    def session(self) -> str:
        return self._batch.sessions[self._row]

    @property
    def chunk(self) -> int:
        return self._batch.chunk_index(self._row)

    @property
    def latent(self) -> np.ndarray[Any, Any]:
        latent = self._latent
        if latent is None:
            latent = self._latent = self._batch.latents[self._row]
        return latent

    @property
    def timing(self) -> Timing:
        return self._batch.timing(self._row)

    @property
    def applied(self) -> int:
        return self._batch.applied_of(self._row)

    @property
    def lease(self) -> tuple[ChunkBatch, int]:
        return self._batch, self._row

    def release(self) -> None:
        """Hand the chunk's memory back to the engine (idempotent)."""
        core, self._core = self._core, None
        if core is not None:
            core.release_chunk(self._batch, self._row)

    @property
    def released(self) -> bool:
        return self._core is None

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
        self._deferred: list[ChunkBatch] = []  # batches with rows released, not given back
        self.eager = False  # True: a chunk's release goes back at once (see the module)
        self.late: LateExports | None = None  # exports given up on, on their way (the client's)

    # -- requests -------------------------------------------------------------

    def next_seq(self) -> int:
        self._seq = self._seq % 0xFFFFFFFF + 1  # never 0: that answers nothing
        return self._seq

    def attach(
        self,
        session: str,
        conditioning: Mapping[str, Any] | None,
        credits: int,
        priority: int,
        state: SessionState | None = None,
    ) -> Attach:
        """The checked, numbered request of an attach (moving in with ``state``)."""
        session, credits = arguments.session(session), arguments.credits(credits)
        cond = dict(arguments.conditioning(conditioning, "attach") or {})
        if state is not None:
            cond = with_state(arguments.moved_state(session, state, cond), state)
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

    def suspend(self, session: str) -> Suspend:
        session = arguments.session(session)
        self.check_open()
        return Suspend(session, self.next_seq())

    def resume(self, session: str) -> Resume:
        session = arguments.session(session)
        self.check_open()
        return Resume(session, self.next_seq())

    def export(self, session: str) -> Export:
        session = arguments.session(session)
        self.check_open()
        return Export(session, self.next_seq())

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

    def answer(self, seq: int) -> Notice:
        """A call's final answer came: return it, or raise what it says."""
        reply = self._replies.pop(seq)
        if reply.kind is NoticeKind.REJECTED:
            raise AdmissionError(reply.message)
        if reply.kind is NoticeKind.ERROR:
            raise RequestError(reply.message)
        return reply

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
                if self.late is not None:
                    self.late.lost(item.session)  # (an export given up on: never answered)
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
        if self._deferred:  # a new step: what chunks released goes back first
            self.flush()
        batch = self._batches.popleft()
        if self._cursor:
            batch, self._cursor = batch.tail(self._cursor), 0
        self._held += len(batch)
        return batch

    def take_chunk(self) -> Chunk:
        """The next chunk; only when :meth:`has_chunks`."""
        chunk = self.next_chunk()
        assert chunk is not None  # (the caller checked has_chunks)
        return chunk

    def next_chunk(self) -> Chunk | None:
        """The next chunk if one waits (None if not): :meth:`take_chunk` on the
        poll's fast path. ClientClosedError once closed."""
        batches = self._batches
        if not batches:
            self.check_open()  # (closing empties the queue)
            return None
        batch, i = batches[0], self._cursor
        if not i and self._deferred:  # a new step: what chunks released goes back first
            self.flush()
        if i + 1 == len(batch.sessions):
            batches.popleft()
            self._cursor = 0
        else:
            self._cursor = i + 1
        self._held += 1
        return Chunk(batch, i, self)

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

    def release_chunk(self, batch: ChunkBatch, row: int) -> None:
        """A chunk's release: count it now; its row goes back with the batch's
        last, or at the next :meth:`flush` (see the module)."""
        deferred = batch.defer_row(row)
        if not deferred or self.closed:  # released already; closed: nothing goes back
            return
        self._held -= 1
        if self.eager or not batch.unreleased:
            rows = batch.take_deferred()
            if rows is not None:
                self._give_back(batch, rows)
        elif deferred == 1:
            self._deferred.append(batch)

    def flush(self) -> None:
        """Give back every row chunks released and not yet given back (one
        transport call per batch)."""
        batches, self._deferred = self._deferred, []
        for batch in batches:
            rows = batch.take_deferred()
            if rows is not None and not self.closed:
                self._give_back(batch, rows)

    def close(self) -> bool:
        """Forget every batch and session; True the first time (the caller leaves)."""
        if self.closed:
            return False
        self.closed = True
        self._batches.clear()
        self._deferred.clear()
        self._held = 0
        self.sessions.clear()
        return True
