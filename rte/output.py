"""The engine's output side: where chunks are written, and what is not yet emitted.

DEFERRED writes each chunk once, in place, into a buffer an
:class:`OutputAllocator` hands out per decoded batch: one fresh NumPy block by
default (:class:`HeapAllocator`), page-locked blocks on CUDA
(:class:`rte.lanes.torch.PinnedHeap`), a transport's shared slab in the daemon
(:class:`rte.ipc.allocator.SlabAllocator`). :class:`InFlight` holds what a
step has not yet emitted: the HOT batches not yet decoded (pipelining) and the
buffers allocated by the call under way, which a failed call gives back.
:func:`chunk_results` turns a decoded batch into its CHUNK results;
:class:`BatchResults` is the same answer made only when looked at, for a host
that delivers a batch from its own record of it (the daemon: its slab leases).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any, Protocol, overload

import numpy as np

from rte.contract import Manifest, ResultKind, StepResult, Timing
from rte.stages import Batch


class OutputAllocator(Protocol):
    """Hands DEFERRED the buffers a batch's chunks are written into, once, in place.

    The engine calls ``allocate`` exactly once per decoded batch, after its
    ``sessions``, ``chunks`` and ``generated_ns`` are filled, so a transport can
    lease one contiguous run of its shared slab per batch and the serve loop
    copies nothing. The chunks of one ``allocate`` are emitted by the same
    ``step``/``finalize`` call that allocated them: when that call returns,
    everything allocated during it was either emitted in its results or given
    back through ``discard`` (the in-flight output of a failed call).

    Whether the buffers are one run is the allocator's to say, once, as it
    makes them (for a slab, :func:`shm.one_run`'s answer in the loan): it sets
    ``batch.out_block`` to the run as one ``(n, *shape)`` array (rows
    ``strides[0]`` bytes apart, every byte between them the batch's) when they
    are one, or ``batch.out_spans`` (a run per group of positions, None for a
    group that is scattered) when the batch is cut into several. The engine
    and the model carry that answer and never look at the buffers' addresses
    to find it again; an allocator that sets neither gets a copy per chunk.
    """

    def allocate(self, batch: Batch) -> list[np.ndarray[Any, Any]]:
        """One output buffer per row of ``batch`` (in its row order), written once by DEFERRED."""
        ...

    def discard(self, batch: Batch, buffers: list[np.ndarray[Any, Any]]) -> None:
        """The chunks of ``batch`` will not be emitted (a failed step): take the buffers back."""
        ...


class HeapAllocator:
    """The default allocator: one fresh NumPy block per batch, a row per chunk."""

    def __init__(self, manifest: Manifest) -> None:
        self._shape = manifest.latent_shape
        self._dtype = np.dtype(manifest.latent_dtype)

    def allocate(self, batch: Batch) -> list[np.ndarray[Any, Any]]:
        block = batch.out_block = np.empty((len(batch.rows), *self._shape), self._dtype)
        return list(block)

    def discard(self, batch: Batch, buffers: list[np.ndarray[Any, Any]]) -> None:
        return None


_new_result = functools.partial(tuple.__new__, StepResult)  # a StepResult from a tuple, in C


def chunk_results(batch: Batch, emitted_ns: int) -> list[StepResult]:
    """A CHUNK result per row of the decoded ``batch``, in row order, sharing one Timing."""
    timing = Timing(batch.generated_ns, emitted_ns)
    fields = (batch.sessions, batch.chunks, repeat(ResultKind.CHUNK), batch.out, repeat(timing))
    tail = (repeat(None), repeat(0))  # error None, applied 0 (the serve loop stamps it)
    return list(map(_new_result, zip(*fields, *tail, strict=False)))


class BatchResults(Sequence[StepResult]):
    """:func:`chunk_results` of one decoded batch (a CHUNK result per row, in row
    order, sharing one Timing), each made when it is looked at.

    A result costs a Python object (~0.15 us here: 10 us a step at 64 sessions,
    a seventh of a flat-out daemon's turn), and a host that delivers the batch
    from its own record of it reads only ``len`` and :attr:`timing` (the daemon,
    whose slab leases hold the rows). Iterating, slicing or comparing makes the
    whole list once (then kept); one index makes that one result.
    """

    __slots__ = ("_all", "batch", "timing")

    def __init__(self, batch: Batch, emitted_ns: int) -> None:
        self.batch = batch
        self.timing = Timing(batch.generated_ns, emitted_ns)
        self._all: list[StepResult] | None = None

    def made(self) -> list[StepResult]:
        """Every result, as :func:`chunk_results` makes them (made once)."""
        if self._all is None:
            self._all = chunk_results(self.batch, self.timing.emitted_ns)
        return self._all

    @property
    def is_made(self) -> bool:
        """Whether the results were made (something looked at them all)."""
        return self._all is not None

    def __len__(self) -> int:
        return len(self.batch.sessions)

    @overload
    def __getitem__(self, index: int) -> StepResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[StepResult]: ...

    def __getitem__(self, index: int | slice) -> StepResult | list[StepResult]:
        return self.made()[index]

    def __iter__(self) -> Iterator[StepResult]:
        return iter(self.made())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BatchResults):
            other = other.made()
        return isinstance(other, list) and self.made() == other

    __hash__ = None  # type: ignore[assignment]  # (equal to a list: unhashable as one)

    def __repr__(self) -> str:
        return f"BatchResults({self.made()!r})"


class InFlight:
    """An engine's output side: HOT batches not yet decoded, and buffers not yet emitted.

    In-flight chunks are held per HOT batch, with the positions already taken
    (decoded or dropped), never per row: the common step, whose due rows are
    exactly the newest batch's, takes it whole without looking at a row. Output
    buffers are allocated once per decoded batch and remembered until the call
    that allocated them emits them (``emitted``) or fails (``discard``).
    """

    def __init__(self, allocator: OutputAllocator) -> None:
        self.allocator = allocator
        self._held: list[tuple[Batch, object, set[int]]] = []  # oldest first
        self._unemitted: list[tuple[Batch, list[np.ndarray[Any, Any]]]] = []

    def hold(self, batch: Batch, key: object) -> None:
        """Keep the HOT ``batch``, made under ``key``, until its rows are taken."""
        self._held.append((batch, key, set()))

    def take_newest(self, key: object) -> list[Batch]:
        """The newest batch, whole, if it was made under ``key`` and none of it is taken."""
        if self._held and self._held[-1][1] is key and not self._held[-1][2]:
            return [self._held.pop()[0]]
        return []

    def take(self, rows: Sequence[int]) -> list[Batch]:
        """The held chunks of ``rows``: of each batch holding any, the subset of them,
        batches in the order of their first row in ``rows``."""
        where: dict[int, tuple[int, int]] = {}
        for n, (batch, _, taken) in enumerate(self._held):
            where.update((r, (n, p)) for p, r in enumerate(batch.rows) if p not in taken)
        groups: dict[int, list[int]] = {}
        for row in rows:
            if row in where:
                n, position = where[row]
                groups.setdefault(n, []).append(position)
        for n, positions in groups.items():
            self._held[n][2].update(positions)
        batches = [self._held[n][0].subset(sorted(p)) for n, p in groups.items()]
        self._prune()
        return batches

    def drop(self, row: int) -> None:
        """Forget the held chunk of ``row`` (its session left)."""
        for batch, _, taken in self._held:
            taken.update(p for p, r in enumerate(batch.rows) if r == row)
        self._prune()

    def allocate(self, batch: Batch) -> None:
        """Fill ``batch.out`` from the allocator; the buffers count as not yet emitted."""
        batch.out_block = batch.out_spans = None
        buffers = self.allocator.allocate(batch)
        self._unemitted.append((batch, buffers))
        if len(buffers) != len(batch.rows):
            raise ValueError(f"allocate gave {len(buffers)} buffers for {len(batch.rows)} rows")
        batch.out = buffers  # out_block / out_spans: the allocator's word, carried as is

    def emitted(self) -> None:
        """Everything allocated so far is in the results about to be returned."""
        self._unemitted.clear()

    def discard(self) -> None:
        """The failure boundary: forget every held chunk, give back every unemitted buffer."""
        self._held.clear()
        unemitted, self._unemitted = self._unemitted, []
        for batch, buffers in unemitted:
            self.allocator.discard(batch, buffers)

    def _prune(self) -> None:
        self._held = [held for held in self._held if len(held[2]) < len(held[0].rows)]
