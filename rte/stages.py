"""What a model gives ComposedEngine, and what the engine gives it back: the model's API.

A model is a :class:`StageModel`: a manifest, an ordered list of lane-tagged
:class:`Stage` s, and ``seed``/``detach`` (optionally ``seed_ready``,
``check_conditioning``, ``heavy_keys``, ``heavy_equal``, and the capability to
export and import a row's state: ``state_identity``, ``export_rows``,
``import_rows``, :mod:`rte.state`). Every stage works on
a :class:`Batch`: the rows of one call, their conditioning, a ``carry`` from
HOT to DEFERRED, and the output buffers DEFERRED writes each chunk into (as
one ``(n, *shape)`` array too, ``out_block``, when they are one run). Where
those buffers come from, and what becomes of them, is the engine's output
side (:mod:`rte.output`); the machinery that runs the stages is
:mod:`rte.composed`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rte.conditioning import conditioning_equal
from rte.contract import Manifest
from rte.lanes import Lane
from rte.state import ModelIdentity, RowState


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
    # ``out`` as one (n, *shape) array, when it is one: set by the allocator, which alone
    # decides it (its rows ``strides[0]`` bytes apart, every byte between them the
    # batch's: a slab run, a heap block); see rte.output.OutputAllocator
    out_block: np.ndarray[Any, Any] | None = None
    # ``out`` as several such runs when it is not one (a batch of several clients'
    # sessions, one run per client): (positions in the batch, the run or None)
    out_spans: list[tuple[list[int], np.ndarray[Any, Any] | None]] | None = None
    generated_ns: int = 0
    # ``chunks`` as int64 words, when the engine made them so (a HOT batch: its rows'
    # ages), for a writer that reads the column in place (rte.ipc.outbound); None
    # otherwise (a subset): read ``chunks``
    chunk_words: np.ndarray[Any, Any] | None = None
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

    # -- optional: a row's state out and back in (suspend, resume, migration) ----

    def state_identity(self) -> ModelIdentity | None:
        """Whose row states this model exports and imports (its name, a digest of its
        configuration and weights, its state format version); None (the default):
        it cannot, and the engine refuses to suspend its sessions."""
        return None

    def export_rows(self, rows: Sequence[int]) -> list[RowState]:
        """The state of each of ``rows`` (seeded), at a chunk boundary, as host
        arrays the model no longer writes (copies). Runs on HOT, after the HOT work
        queued for them (and after any encode of them completed)."""
        raise NotImplementedError(f"{type(self).__name__} does not export its rows")

    def import_rows(self, rows: Sequence[int], states: Sequence[RowState]) -> None:
        """Make each of ``rows`` (free) hold its state in ``states``, exported by a model
        of the same :meth:`state_identity`: the row then goes on as the exported one
        would have. Runs on HOT; raise :class:`~rte.errors.StateError` for a state
        that does not fit (:meth:`RowState.array` checks an array)."""
        raise NotImplementedError(f"{type(self).__name__} does not import rows")


def check_stages(model: StageModel, stages: Sequence[Stage]) -> None:
    """ValueError unless ``stages`` (``model.stages()``) can make chunks: a HOT stage
    and a DEFERRED stage, and an ENCODE stage if the model declares heavy keys."""
    lanes = {s.lane for s in stages}
    if Lane.HOT not in lanes or Lane.DEFERRED not in lanes:
        raise ValueError(
            f"{type(model).__name__} needs at least one HOT stage (makes the latent) "
            "and one DEFERRED stage (writes each chunk into its output buffer)"
        )
    heavy = model.heavy_keys()
    if heavy and Lane.ENCODE not in lanes:
        raise ValueError(
            f"{type(model).__name__} declares heavy keys {sorted(heavy)} "
            "but has no ENCODE stage to encode them"
        )


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
