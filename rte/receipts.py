"""Receipts: which action each chunk reflects.

``act`` returns the request's ``seq``; every emitted chunk carries ``applied``,
the ``seq`` of the last action handed to the engine for its session before the
chunk was generated (0: none since the session attached). A caller then tells
"received" from "applied" and measures input-to-photon from outside.

A chunk's index ``j`` is the session's ``j``-th generated chunk since attach,
so an action handed over at a step applies from the first chunk that step (or
the next one that generates for the session) makes. The step's result says
which index that is: a CHUNK result of chunk ``c`` generated ``c`` (depth 1)
or emitted ``c`` and generated ``c + 1`` (depth 2: the chunk generated at step
``k`` is emitted at ``k + 1``); a WARMUP (depth 2's first step) generated
``c - 1``; a PENDING or ENCODING row generated nothing, so the next one,
``c``, is the first to apply it; an ERROR result refused the action. Each
session keeps ``(first chunk, seq)`` marks until a chunk reaches them, so the
cost is a dictionary look-up per chunk of a session that acted, and none at
all while no session has acted.

A session that moves (an export, a checkpoint) takes its receipts along
(:meth:`Receipts.of`, in its state's host half: :class:`rte.state.HostHalf`)
and the host it moves to goes on from them (:meth:`Receipts.restore`), so a
chunk carries the same ``applied`` on either host. The seqs are those of the
client that acted: a :class:`~rte.client.PoolClient` numbers its requests
across all its daemons, so they stay its own when a session moves in the pool;
a state attached by another client carries the first client's seqs.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

from rte.contract import ResultKind, StepResult
from rte.output import BatchResults

_CHUNK, _WARMUP, _ERROR = ResultKind.CHUNK, ResultKind.WARMUP, ResultKind.ERROR


FEW_ACTIONS = 4  # up to this many actions in a step are found in its batch by position
MAX_COLUMNS = 64  # lists of sessions whose column is kept (a client's each, usually)


class Receipts:
    """Per session, the seq each of its chunks applied. ``pipelined``: depth 2."""

    def __init__(self, pipelined: bool) -> None:
        self.ahead = int(pipelined)
        self.current: dict[str, int] = {}  # session -> the seq its last stamped chunk applied
        self._marks: dict[str, collections.deque[tuple[int, int]]] = {}
        self._leaving: list[str] = []  # detached: forgotten at the next step
        # the columns made, by the list of sessions each was made for (the engine hands
        # the same list, one per client, while its cohort stays): (sessions, column, rows)
        self._columns: dict[int, tuple[list[str], list[int], dict[str, int]]] = {}

    @property
    def active(self) -> bool:
        """Whether any chunk may carry a seq (some session has acted)."""
        return bool(self.current or self._marks)

    def settle(self) -> None:
        """Before a step: forget the sessions that left (their last chunks are out)."""
        for session in self._leaving:
            self.current.pop(session, None)
            self._marks.pop(session, None)
        if self._leaving:
            self._columns.clear()
        self._leaving.clear()

    def handed(self, results: Sequence[StepResult], seqs: Mapping[str, int]) -> None:
        """The step that made ``results`` was handed the actions of ``seqs`` (session -> seq)."""
        if type(results) is BatchResults:  # every one a CHUNK: read from its columns
            self._handed_batch(results, seqs)
            return
        ahead = self.ahead
        for r in results:
            seq = seqs.get(r.session)
            if seq is None:
                continue
            kind = r.kind
            if kind is _CHUNK:
                first = r.chunk + ahead
            elif kind is _WARMUP:
                first = r.chunk - ahead
            elif kind is _ERROR:
                continue  # the action was refused
            else:  # PENDING, ENCODING: nothing generated; the next chunk applies it
                first = r.chunk
            self._marks.setdefault(r.session, collections.deque()).append((first, seq))

    def applied(self, session: str, chunk: int) -> int:
        """The seq chunk ``chunk`` of ``session`` applied (chunks asked in order)."""
        marks = self._marks.get(session)
        if marks:
            while marks and marks[0][0] <= chunk:
                self.current[session] = marks.popleft()[1]
            if not marks:
                del self._marks[session]
        return self.current.get(session, 0)

    def column(self, sessions: list[str], chunks: list[int]) -> list[int] | None:
        """Each row's applied seq; None when every one is 0 (no session has acted)."""
        if not self.active:
            return None
        applied, cached = self.applied, self._columns.get(id(sessions))
        if cached is not None and cached[0] is sessions:  # only rows with marks change
            _, column, row = cached
            for session in list(self._marks):
                i = row.get(session)
                if i is not None:
                    column[i] = applied(session, chunks[i])
            return column
        column = [applied(s, c) for s, c in zip(sessions, chunks, strict=True)]
        if len(self._columns) >= MAX_COLUMNS:
            self._columns.clear()
        self._columns[id(sessions)] = (sessions, column, {s: i for i, s in enumerate(sessions)})
        return column

    def _handed_batch(self, results: BatchResults, seqs: Mapping[str, int]) -> None:
        """:meth:`handed` read from the batch's columns (no result made): a few
        actions looked up by position, many by a walk of the batch."""
        sessions, chunks, ahead = results.batch.sessions, results.batch.chunks, self.ahead
        if len(seqs) <= FEW_ACTIONS:
            found = [(s, seq, sessions.index(s)) for s, seq in seqs.items() if s in sessions]
            marks = [(s, chunks[i] + ahead, seq) for s, seq, i in found]
        else:
            get, pairs = seqs.get, zip(sessions, chunks, strict=True)
            marks = [(s, c + ahead, q) for s, c in pairs if (q := get(s)) is not None]
        for session, first, seq in marks:
            self._marks.setdefault(session, collections.deque()).append((first, seq))

    def stamp(self, results: Sequence[StepResult]) -> Sequence[StepResult]:
        """``results`` with each CHUNK's ``applied`` set (the same ones if all are 0)."""
        if not self.active:
            return results
        out = []
        applied, new = self.applied, tuple.__new__
        for result in results:
            if result.kind is _CHUNK:
                seq = applied(result.session, result.chunk)
                if seq:  # the same fields, ``applied`` (the last) set: no _replace
                    result = new(StepResult, (*result[:-1], seq))  # noqa: PLW2901
            out.append(result)
        return out

    def of(self, session: str) -> tuple[int, tuple[tuple[int, int], ...]]:
        """``session``'s receipts as they stand: the seq its last stamped chunk
        applied, and the ``(first chunk, seq)`` marks no emitted chunk reached yet."""
        return self.current.get(session, 0), tuple(self._marks.get(session, ()))

    def restore(self, session: str, applied: int, marks: tuple[tuple[int, int], ...]) -> None:
        """``session`` moved in with the receipts :meth:`of` gave where it was (it
        may have left here this very turn: it is not forgotten then)."""
        if session in self._leaving:
            self._leaving = [s for s in self._leaving if s != session]
        self.current.pop(session, None)
        self._marks.pop(session, None)
        if applied:
            self.current[session] = applied
        if marks:
            self._marks[session] = collections.deque(marks)
        self._columns.clear()  # (a cached column would not see its current seq)

    def forget(self, session: str) -> None:
        """The session left: its next binding counts from 0. Its chunks finalized at
        the detach are still to be delivered, so it is forgotten at the next step."""
        self._leaving.append(session)
