"""What a model gives ComposedEngine, and what the engine gives it back.

A model is a :class:`StageModel`: a manifest, an ordered list of lane-tagged
:class:`Stage` s, and ``seed``/``detach`` (optionally ``seed_ready``,
``check_conditioning``, ``heavy_keys``, ``heavy_equal``). Every stage works on
a :class:`Batch`: the rows of one call, their conditioning, a ``carry`` from
HOT to DEFERRED, and the output buffers DEFERRED writes each chunk into (as
one ``(n, *shape)`` array too, ``out_block``, when they are one run), which
an :class:`OutputAllocator` hands out per batch (one fresh block by default; a
transport's shared slab in the daemon). :class:`InFlight` is the engine's
output side: the HOT batches not yet decoded, and the buffers not yet emitted.
The machinery that runs them is :mod:`rte.composed`.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Protocol

import numpy as np

from rte.conditioning import conditioning_equal
from rte.contract import Manifest, ResultKind, StepResult, Timing
from rte.lanes import Lane


@dataclass
class Batch:
    """The rows one stage call works on, in row order of the call.

    HOT stages read ``conditioning`` and fill ``carry`` with per-batch values
    (arrays whose first axis follows ``rows``); DEFERRED stages read ``carry``
    and write each row's chunk into ``out[i]`` in place. ENCODE stages see in
    ``conditioning`` only the heavy keys that changed, with their new values.
    Stages treat ``rows``, ``sessions`` and ``conditioning`` (the lists, and
    the dicts in them) as read-only: the engine shares them between the
    batches of consecutive steps.
    """

    rows: list[int]
    sessions: list[str]
    chunks: list[int]
    conditioning: list[dict[str, Any]]
    carry: dict[str, Any] = field(default_factory=dict)
    out: list[np.ndarray[Any, Any]] = field(default_factory=list)
    # ``out`` as one (n, *shape) array, when it is one: set by the allocator (its rows
    # ``strides[0]`` bytes apart, every byte between them the batch's: a slab run), or
    # by the engine when the rows lie end to end
    out_block: np.ndarray[Any, Any] | None = None
    # ``out`` as several such runs when it is not one (a batch of several clients'
    # sessions, one run per client): (positions in the batch, the run or None)
    out_spans: list[tuple[list[int], np.ndarray[Any, Any] | None]] | None = None
    generated_ns: int = 0
    ready: object = None  # a lane marker set after HOT; DEFERRED waits for it
    source: tuple[Batch, list[int]] | None = None  # a subset's whole batch and positions

    def __len__(self) -> int:
        return len(self.rows)

    def subset(self, positions: list[int]) -> Batch:
        """The same batch restricted to ``positions`` (itself when that is all of it).

        Its ``carry`` is empty until :meth:`take_carry` fills it from this batch,
        which the engine runs on the DEFERRED lane after HOT's event: on CUDA the
        carry may not be computed yet when the subset is made."""
        if positions == list(range(len(self.rows))):
            return self
        return Batch(
            rows=[self.rows[p] for p in positions],
            sessions=[self.sessions[p] for p in positions],
            chunks=[self.chunks[p] for p in positions],
            conditioning=[self.conditioning[p] for p in positions],
            generated_ns=self.generated_ns,
            ready=self.ready,
            source=(self, positions),
        )

    def take_carry(self, whole: Batch) -> None:
        """Fill ``carry`` with this subset's rows of ``whole``'s (a lane runs it)."""
        positions = self.source[1] if self.source is not None else []
        self.carry = {key: _take(value, positions) for key, value in whole.carry.items()}


def one_block(buffers: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any] | None:
    """``buffers`` as one writable ``(n, *shape)`` array when they lie end to end in
    memory; else None."""
    first = buffers[0] if buffers else None
    if first is None or not first.flags.writeable or not first.flags.c_contiguous:
        return None
    step = first.nbytes
    for i, buffer in enumerate(buffers):
        if (
            buffer.ctypes.data != first.ctypes.data + i * step
            or buffer.shape != first.shape
            or buffer.dtype != first.dtype
            or not buffer.flags.c_contiguous
        ):
            return None
    shape, strides = (len(buffers), *first.shape), (step, *first.strides)
    return np.lib.stride_tricks.as_strided(first, shape, strides, writeable=True)


def _take(value: Any, positions: list[int]) -> Any:
    """The rows ``positions`` of one carry value: lists are picked, arrays indexed."""
    if isinstance(value, list):
        return [value[p] for p in positions]
    first = positions[0] if positions else 0
    if positions == list(range(first, first + len(positions))):
        return value[first : first + len(positions)]  # a view: nothing copied to a device
    if getattr(value, "is_cuda", False):  # a torch tensor: torch is loaded
        import torch  # noqa: PLC0415

        index = torch.tensor(positions).pin_memory().to(value.device, non_blocking=True)
        return value.index_select(0, index)  # (a list index would copy it synchronously)
    return value[positions]  # NumPy and torch both index with a list of ints


@dataclass(frozen=True)
class Stage:
    """One step of a model's work, tagged with the lane it runs on."""

    name: str
    lane: Lane
    fn: Callable[[Batch], object]


class StageModel(abc.ABC):
    """A model as ComposedEngine sees it. Rows are arena indices in
    ``range(manifest().max_sessions)``; a model keeps its per-row state there.

    Stages must be boundary-atomic (a failing stage leaves its rows as they
    were), because a generic scheduler cannot roll back a half-updated cache.
    ENCODE stages may run concurrently with HOT and DEFERRED: they must touch
    only their own rows and no shared scratch space.

    ``device`` says where the model computes (``"cpu"``, ``"cuda"``,
    ``"cuda:N"``): the engine runs its stages on CUDA streams when it is CUDA.
    """

    device: Any = "cpu"

    @abc.abstractmethod
    def manifest(self) -> Manifest: ...

    @abc.abstractmethod
    def stages(self) -> Sequence[Stage]: ...

    @abc.abstractmethod
    def seed(self, batch: Batch) -> None:
        """Initialise the rows of ``batch`` from their conditioning (runs on HOT)."""

    @abc.abstractmethod
    def detach(self, row: int) -> None:
        """Forget ``row``; it may be reused by a later seed."""

    def seed_ready(self, pending: Sequence[int]) -> bool:
        """Whether to seed the pending rows now (default: as soon as any is pending)."""
        return bool(pending)

    def conditioning_keys(self) -> frozenset[str] | None:
        """The conditioning keys this model takes; None takes any key.

        The engine refuses any other key on attach and on every action, so a
        typo (``mvoe``) is an error for its sender, never silently ignored.
        """
        return None

    def check_conditioning(self, conditioning: Mapping[str, Any]) -> None:
        """Raise ValueError, saying what is wrong, if ``conditioning`` is malformed.

        Called on attach and on every action before anything is applied, so a
        bad value is refused for its own session and never reaches a stage.
        """
        return None

    def heavy_keys(self) -> frozenset[str]:
        """Conditioning keys whose change goes through the ENCODE lane."""
        return frozenset()

    def heavy_equal(self, key: str, a: Any, b: Any) -> bool:
        """Whether two values of heavy key ``key`` are the same (no re-encode needed)."""
        return conditioning_equal(a, b)


def check_conditioning(
    model: StageModel, keys: frozenset[str] | None, conditioning: Mapping[str, Any]
) -> None:
    """ValueError for a key ``model`` does not take (``keys``: its ``conditioning_keys()``),
    or a value it refuses (its ``check_conditioning``)."""
    if keys is not None and not keys.issuperset(conditioning):
        unknown = ", ".join(repr(k) for k in sorted(set(conditioning) - keys))
        raise ValueError(
            f"unknown conditioning key {unknown}: {model.manifest().model or 'this model'} "
            f"takes {', '.join(sorted(keys))}"
        )
    model.check_conditioning(conditioning)


def check_session_id(session: str) -> None:
    """ValueError unless ``session`` is a str that is valid UTF-8 (models hash it, the
    wire carries it: a lone surrogate would fail the seed, not the attach)."""
    if not isinstance(session, str):
        raise ValueError(f"a session id is a str, got {type(session).__name__}")
    try:
        session.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"session id {session!r} is not valid UTF-8 text ({exc.reason} at {exc.start}); "
            "use another id"
        ) from None


class OutputAllocator(Protocol):
    """Hands DEFERRED the buffers a batch's chunks are written into, once, in place.

    The engine calls ``allocate`` exactly once per decoded batch, after its
    ``sessions``, ``chunks`` and ``generated_ns`` are filled, so a transport can
    lease one contiguous run of its shared slab per batch and the serve loop
    copies nothing. The chunks of one ``allocate`` are emitted by the same
    ``step``/``finalize`` call that allocated them: when that call returns,
    everything allocated during it was either emitted in its results or given
    back through ``discard`` (the in-flight output of a failed call).
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
        batch.out = buffers
        if batch.out_block is None:
            batch.out_block = one_block(buffers)

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
