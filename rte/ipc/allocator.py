"""SlabAllocator: the engine's output buffers are leases of slab slots, a batch at a time.

The engine's DEFERRED lane writes each chunk into the buffer the allocator
hands it (:class:`rte.output.OutputAllocator`); here a decoded batch's
buffers are slots of the shared slab, leased per owner (the client a session
belongs to) in one call each, as one run of adjacent slots when one is free:
each client's chunks of a step are written once, in place, as one array
where their reader will look at them: ``batch.out_block`` when the batch is
one client's, ``batch.out_spans`` (a run per client) when it holds several
clients' sessions, so a model copies once per client, not once per frame.

A :class:`Lease` is the one object a client's chunks of a batch travel in,
from the engine's call to the STEP record: its slots (whether they are one run
was decided once, when they were leased: :attr:`shm.BatchLoan.contiguous`),
the sessions and chunk indices its rows hold, and when they were generated
and emitted. The serve loop turns each engine call's chunk results into that
call's leases (:meth:`SlabAllocator.emitted`, its ``emit``), so what a step
returns is the leases themselves, in the order of the outcome, beside its
notices; :class:`~rte.ipc.outbound.Outbound` writes each STEP record from
them and reads nothing else. A failed call's leases are aborted (``discard``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rte.contract import Manifest, ResultKind, StepResult
from rte.ipc.clients import Connection
from rte.output import BatchResults
from rte.stages import Batch
from shm import BatchLoan, Slab

Group = tuple[Connection, list[int] | None]  # an owner and its positions (None: all)


@dataclass(eq=False, slots=True)  # (made once a step and client: slots make it cheaper)
class Lease:
    """One client's slots for one decoded batch, and what they hold: row ``i`` of
    ``loan`` is chunk ``chunks[i]`` of session ``sessions[i]``."""

    owner: Connection
    loan: BatchLoan
    sessions: list[str]
    chunks: list[int]
    generated_ns: int
    emitted_ns: int = 0  # set when the engine call that wrote them returns them
    chunk_words: np.ndarray[Any, Any] | None = None  # ``chunks`` as int64, when the batch had them


class SlabAllocator:
    """Leases slab slots as output buffers; ``owner_of(session)`` names the
    connection a session's chunks are charged to and go to. ``owners_version()``,
    when given, changes whenever an owner does: a batch of the same list of
    sessions as the last one (the engine hands the same list step after step)
    is then grouped by owner as the last one was, without asking each session."""

    def __init__(
        self,
        slab: Slab,
        manifest: Manifest,
        owner_of: Callable[[str], Connection],
        owners_version: Callable[[], int] | None = None,
    ) -> None:
        self.slab = slab
        self.shape = manifest.latent_shape
        self.dtype = np.dtype(manifest.latent_dtype)
        self.owner_of = owner_of
        self.owners_version = owners_version
        self._grouped: tuple[list[str], int, list[Group]] = ([], -1, [])  # the last batch's
        self.pending: list[Lease] = []  # leased since the last take, in order
        self._by_batch: dict[int, list[Lease]] = {}

    def _groups(self, sessions: list[str]) -> list[Group]:
        """``sessions``' owners, each with its positions (None: all of them)."""
        version = self.owners_version() if self.owners_version is not None else None
        cached = self._grouped
        if version is not None and cached[0] is sessions and cached[1] == version:
            return cached[2]  # the same list of sessions, the same owners
        owners = list(map(self.owner_of, sessions))
        first = owners[0]
        groups: list[Group]
        if owners.count(first) == len(owners):  # the usual case: one client's sessions
            groups = [(first, None)]
        else:
            by_owner: dict[int, tuple[Connection, list[int]]] = {}
            for position, owner in enumerate(owners):
                by_owner.setdefault(owner.index, (owner, []))[1].append(position)
            groups = list(by_owner.values())
        if version is not None:
            self._grouped = (sessions, version, groups)
        return groups

    def allocate(self, batch: Batch) -> list[np.ndarray[Any, Any]]:
        sessions, chunks = batch.sessions, batch.chunks
        groups = self._groups(sessions)
        leases = self._by_batch.setdefault(id(batch), [])
        buffers: list[Any] = [None] * len(sessions)
        spans: list[tuple[list[int], Any]] = []
        try:
            for owner, positions in groups:
                n = len(sessions) if positions is None else len(positions)
                loan = self.slab.loan_batch(owner.index, n, self.dtype, self.shape)
                if positions is None:
                    buffers = loan.rows
                    batch.out_block = loan.block  # one run of slots (None if scattered)
                    generated, words = batch.generated_ns, batch.chunk_words
                    lease = Lease(owner, loan, sessions, chunks, generated, chunk_words=words)
                else:
                    for position, row in zip(positions, loan.rows, strict=True):
                        buffers[position] = row
                    spans.append((positions, loan.block))  # a run (None if scattered)
                    picked_sessions = [sessions[p] for p in positions]
                    picked_chunks = [chunks[p] for p in positions]
                    lease = Lease(owner, loan, picked_sessions, picked_chunks, batch.generated_ns)
                leases.append(lease)
                self.pending.append(lease)
        except BaseException:
            self.discard(batch, buffers)
            raise
        if spans:
            batch.out_spans = spans
        return buffers

    def discard(self, batch: Batch, buffers: list[np.ndarray[Any, Any]]) -> None:
        for lease in self._by_batch.pop(id(batch), []):
            lease.loan.abort()
            self.pending.remove(lease)

    def take(self) -> list[Lease]:
        """The leases of the chunks emitted since the last call: the caller
        publishes them (or gives them back)."""
        taken, self.pending = self.pending, []
        self._by_batch.clear()
        return taken

    def emitted(self, results: Sequence[StepResult]) -> tuple[list[Lease], int]:
        """The leases of one engine call that returned ``results``, each stamped
        with when its chunks were emitted, and how many chunks they hold (an
        engine call leases nothing it does not emit or discard, so every lease
        taken here holds its chunks: each row a CHUNK result)."""
        leases = self.take()
        if not leases:
            return leases, 0
        if type(results) is BatchResults:  # one batch, every row a chunk: one time, none made
            for lease in leases:
                lease.emitted_ns = results.timing.emitted_ns
            return leases, len(results)
        if len(leases) == 1:  # the usual case: one batch of one client
            (lease,) = leases
            chunk = ResultKind.CHUNK
            first = next((r for r in results if r.kind is chunk), None)
            lease.emitted_ns = first.timing.emitted_ns if first is not None else time.monotonic_ns()
            return leases, len(lease.sessions)
        # several batches (several clients, or engines): each its own engine's time,
        # that of its rows' results (one batch's results share one Timing)
        by_session = {r.session: r.timing.emitted_ns for r in results}
        for lease in leases:
            when = by_session.get(lease.sessions[0])
            if when is None or any(by_session.get(s) != when for s in lease.sessions):
                raise RuntimeError(
                    f"internal error: the slab lease of sessions {lease.sessions} does not "
                    "match the engine call's results (a row with no result, or rows of "
                    "two emissions): an engine leased output it did not return; report this"
                )
            lease.emitted_ns = when
        return leases, sum(len(lease.sessions) for lease in leases)
