"""ChunkBatch: one step's chunks for one client, handed out and given back whole.

What ``client.poll_batch()`` returns. A step of many sessions arrives as one
batch: ``latents`` is one ``(n, *latent_shape)`` array when the chunks lie in
adjacent slab slots (the usual case; over shared memory it is a read-only view
of the slab, strided by the slot size), else a list of ``n`` arrays; the
per-row session ids, chunk indices and generation times are a list and NumPy
arrays; the step's emit, push and take times are one number each. No Python
object is made per chunk. ``release()`` gives every row back in one call (one
C call over shared memory); ``release_row(i)`` gives one row back at once.

The per-chunk API (:meth:`EngineClient.poll`) is built on batches and pays per
step, not per chunk: a released chunk only marks its row (:meth:`ChunkBatch.defer_row`);
the client core gives a batch's marked rows back in one call when its last row
is released, or before it hands out the next step or waits for one
(:meth:`ChunkBatch.take_deferred`), so a released chunk's slot and credit are
back before the engine can need them for a chunk this client would see.

    batch = client.poll_batch(timeout=1.0)
    if batch is not None:
        with batch:                          # releases every row on exit
            frames = batch.latents           # (n, *shape), no copy
            for session, latent in zip(batch.sessions, frames): ...
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from rte.contract import Timing
from rte.errors import RequestError

# what a transport gives a batch: called with the batch and the rows (indices
# into the transport's lease, i.e. offset by the batch's start) being released
Release = Callable[["ChunkBatch", np.ndarray[Any, Any]], None]
Column = np.ndarray[Any, Any] | memoryview


_UNREAD = memoryview(b"").cast("q")  # a column of_record's batch reads when first asked


class Columns(Protocol):
    """Where a batch's per-row columns come from when first asked (see
    :meth:`ChunkBatch.of_record`): chunk indices, generation times, receipts."""

    def columns(self) -> tuple[Column, Column, Column]: ...


class ChunkBatch:
    """The chunks one step emitted for this client's sessions.

    Attributes:
        sessions: the session of each row.
        chunks: each row's chunk index (int64 array, made on first use).
        latents: ``(n, *shape)`` read-only array when :attr:`contiguous`,
            else a list of ``n`` read-only arrays. Valid until released.
        contiguous: whether :attr:`latents` is one array.
        generated_ns: when each row's chunk began generating (int64 array, made
            on first use).
        emitted_ns: when the step returned the chunks (``time.monotonic_ns``).
        pushed_ns: when the transport handed them over (== emitted in process).
        taken_ns: when this client took them.
        lease: the transport's hold on the batch's memory.
        applied: each row's receipt: the seq of the last action (the value
            ``act`` returned) its session had applied before the chunk was
            generated, 0 for none (int64 array, made on first use).
        unreleased: rows not yet released.
    """

    __slots__ = (
        "_applied",
        "_chunks",
        "_deferred",
        "_generated",
        "_held",
        "_release",
        "_source",
        "_start",
        "contiguous",
        "emitted_ns",
        "latents",
        "lease",
        "pushed_ns",
        "sessions",
        "taken_ns",
        "unreleased",
    )

    def __init__(
        self,
        sessions: list[str],
        chunks: np.ndarray[Any, Any] | memoryview,
        latents: np.ndarray[Any, Any] | Sequence[np.ndarray[Any, Any]],
        generated_ns: np.ndarray[Any, Any] | memoryview,
        *,
        emitted_ns: int,
        pushed_ns: int,
        taken_ns: int,
        release: Release,
        lease: Any = None,
        start: int = 0,
        applied: np.ndarray[Any, Any] | memoryview | Sequence[int] | None = None,
    ) -> None:
        self._set(sessions, latents, emitted_ns, pushed_ns, taken_ns, release, lease, None)
        self._applied = applied  # None: every row 0
        self._chunks = chunks  # int64s: NumPy arrays, or a record's memoryview until asked
        self._generated = generated_ns
        self._start = start

    def _set(
        self,
        sessions: list[str],
        latents: np.ndarray[Any, Any] | Sequence[np.ndarray[Any, Any]],
        emitted_ns: int,
        pushed_ns: int,
        taken_ns: int,
        release: Release,
        lease: Any,
        source: Columns | None,
    ) -> None:
        """What every batch is made with (:meth:`__init__` and :meth:`of_record`)."""
        self.sessions = sessions
        self.latents = latents
        self.contiguous = isinstance(latents, np.ndarray)
        self.emitted_ns = emitted_ns
        self.pushed_ns = pushed_ns
        self.taken_ns = taken_ns
        self.lease = lease
        self._release: Release | None = release  # None once no row is held
        self._held: bytearray | None = None  # per-row 1: held, once a row is released alone
        self.unreleased = len(sessions)
        self._deferred: list[int] = []  # rows released by defer_row, not yet given back
        self._source = source  # (see of_record)

    @classmethod
    def of_record(
        cls,
        sessions: list[str],
        latents: np.ndarray[Any, Any] | Sequence[np.ndarray[Any, Any]],
        emitted_ns: int,
        pushed_ns: int,
        taken_ns: int,
        release: Release,
        lease: Any,
        source: Columns,
    ) -> ChunkBatch:
        """A batch whose per-row columns (chunks, generation times, receipts) are
        read from its record only when first asked (``source.columns()``; the
        transport's lease, say). What a transport builds
        on the path from a record to the caller (every operation there is paid
        cold, once per step, before the caller holds the batch)."""
        self = cls.__new__(cls)
        self._set(sessions, latents, emitted_ns, pushed_ns, taken_ns, release, lease, source)
        self._chunks = self._generated = _UNREAD  # (read when asked)
        self._applied = None
        self._start = 0
        return self

    def _filled(self) -> ChunkBatch:
        """This batch, its columns read from its record first if they were not
        yet (see :meth:`of_record`)."""
        source = self._source
        if source is not None:
            self._source = None
            self._chunks, self._generated, self._applied = source.columns()
        return self

    def __len__(self) -> int:
        return len(self.sessions)

    @property
    def chunks(self) -> np.ndarray[Any, Any]:
        """Each row's chunk index (int64; a view of the record over shared memory)."""
        if not isinstance(self._chunks, np.ndarray):
            self._chunks = np.asarray(self._filled()._chunks)
        return self._chunks

    @property
    def generated_ns(self) -> np.ndarray[Any, Any]:
        """When each row's chunk began generating (int64)."""
        if not isinstance(self._generated, np.ndarray):
            self._generated = np.asarray(self._filled()._generated)
        return self._generated

    @property
    def applied(self) -> np.ndarray[Any, Any]:
        """Each row's receipt (int64): the seq of the last action its chunk applied."""
        if not isinstance(self._applied, np.ndarray):
            raw = self._filled()._applied
            self._applied = (
                np.zeros(len(self), np.int64) if raw is None else np.array(raw, np.int64)
            )
        return self._applied

    def applied_of(self, i: int) -> int:
        """Row ``i``'s receipt, without making the array."""
        applied = self._filled()._applied
        return 0 if applied is None else int(applied[i])

    def chunk_index(self, i: int) -> int:
        """Row ``i``'s chunk index, without making the array."""
        return int(self._filled()._chunks[i])

    def timing(self, i: int) -> Timing:
        """Row ``i``'s timestamps."""
        generated = int(self._filled()._generated[i])
        return Timing(generated, self.emitted_ns, self.pushed_ns, self.taken_ns)

    # -- giving back ---------------------------------------------------------

    def release(self) -> None:
        """Give back every row not yet released, in one call (idempotent). Rows
        a chunk released (:meth:`defer_row`) go back with the client's next
        :meth:`take_deferred`, not here."""
        release, self._release = self._release, None
        if release is None:
            return
        held, n = self._held, len(self)
        if held is None and not self._start:
            rows = _ALL_ROWS.get(n)
            if rows is None:
                rows = _all_rows(n)
        elif held is None:
            rows = np.arange(self._start, self._start + n, dtype=np.intp)
        else:
            rows = np.flatnonzero(np.frombuffer(held, np.uint8)) + self._start
        self._held = bytearray(n)
        self.unreleased = 0
        if len(rows):
            release(self, rows)

    def release_row(self, i: int) -> None:
        """Give back row ``i`` alone, at once (idempotent).
        RequestError for a row this batch does not have (a negative index would
        name a row of the step before this batch's first)."""
        if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < len(self):
            raise RequestError(f"row {i!r}: this batch has rows 0 to {len(self) - 1}")
        release = self._release
        if release is None or not self._mark(int(i)):
            return
        if not self.unreleased:
            self._release = None
        release(self, np.array([i + self._start], dtype=np.intp))

    def defer_row(self, i: int) -> int:
        """Mark row ``i`` released without giving it back yet (the per-chunk
        API's release; the client gives it back with :meth:`take_deferred`).
        Returns how many rows wait to be given back now, 0 when row ``i`` was
        released already (nothing changed)."""
        held = self._held
        if held is None:
            held = self._held = bytearray(b"\x01") * len(self.sessions)
        elif not held[i] or self._release is None:
            return 0
        held[i] = 0  # (the hot path of poll and release: _mark inlined)
        self.unreleased -= 1
        if not self.unreleased:
            self._release = None
        deferred = self._deferred
        deferred.append(i)
        return len(deferred)

    def take_deferred(self) -> np.ndarray[Any, Any] | None:
        """The rows :meth:`defer_row` marked since the last call (indices into
        the lease, as a transport's give back takes them), now the caller's to
        give back; None when there are none."""
        deferred = self._deferred
        if not deferred:
            return None
        self._deferred = []
        rows = np.array(deferred, dtype=np.intp)
        if self._start:
            rows += self._start
        return rows

    def _mark(self, i: int) -> bool:
        """Row ``i`` is released from now on; False when it was already."""
        held = self._held
        if held is None:
            held = self._held = bytearray(b"\x01") * len(self)
        elif not held[i]:
            return False
        held[i] = 0
        self.unreleased -= 1
        return True

    @property
    def released(self) -> bool:
        """Whether no row is held (every one released, given back or about to be)."""
        return self._release is None

    def tail(self, start: int) -> ChunkBatch:
        """Rows ``start`` onwards as a batch of their own (same lease), given up
        by this one: what poll_batch hands out after poll took the first rows."""
        self._filled()
        rest = ChunkBatch(
            self.sessions[start:],
            self._chunks[start:],
            self.latents[start:],
            self._generated[start:],
            emitted_ns=self.emitted_ns,
            pushed_ns=self.pushed_ns,
            taken_ns=self.taken_ns,
            release=self._release or _nothing,
            lease=self.lease,
            start=self._start + start,
            applied=None if self._applied is None else self._applied[start:],
        )
        held = self._held
        if held is not None:  # rows released already stay released in the rest
            rest._held = held[start:]
            rest.unreleased = sum(rest._held)
        if not rest.unreleased:
            rest._release = None
        given = len(self) - start if held is None else sum(held[start:])
        self._held = (bytearray(b"\x01") * start if held is None else held[:start]) + bytearray(
            len(self) - start
        )
        self.unreleased -= given
        if not self.unreleased:
            self._release = None
        return rest

    def __enter__(self) -> ChunkBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        run = "one array" if self.contiguous else "rows"
        return f"<ChunkBatch {len(self)} chunks ({run}) {state}>"


def _nothing(batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
    return None


_ALL_ROWS: dict[int, np.ndarray[Any, Any]] = {}  # read-only 0..n-1, by n (see _all_rows)


def _all_rows(n: int) -> np.ndarray[Any, Any]:
    """Rows ``0 .. n-1``, read-only: what a whole batch's release gives back, made
    once per size (a NumPy call costs tens of microseconds on a cold path)."""
    rows = np.arange(n, dtype=np.intp)
    rows.flags.writeable = False
    if n <= 4096:
        _ALL_ROWS[n] = rows
    return rows
