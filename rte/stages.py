"""What a model gives ComposedEngine, and what the engine gives it back.

A model is a :class:`StageModel`: a manifest, an ordered list of lane-tagged
:class:`Stage` s, and ``seed``/``detach`` (optionally ``seed_ready``,
``check_conditioning``, ``heavy_keys``, ``heavy_equal``). Every stage works on
a :class:`Batch`: the rows of one call, their conditioning, a ``carry`` from
HOT to DEFERRED, and the output buffers DEFERRED writes each chunk into, which
an :class:`OutputAllocator` hands out (fresh arrays by default; a transport's
shared slab in the daemon). The machinery that runs them is
:mod:`rte.composed`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rte.conditioning import conditioning_equal
from rte.contract import Manifest
from rte.lanes import Lane


@dataclass
class Batch:
    """The rows one stage call works on, in row order of the call.

    HOT stages read ``conditioning`` and fill ``carry`` with per-batch values
    (arrays whose first axis follows ``rows``); DEFERRED stages read ``carry``
    and write each row's chunk into ``out[i]`` in place. ENCODE stages see in
    ``conditioning`` only the heavy keys that changed, with their new values.
    """

    rows: list[int]
    sessions: list[str]
    chunks: list[int]
    conditioning: list[dict[str, Any]]
    carry: dict[str, Any] = field(default_factory=dict)
    out: list[np.ndarray[Any, Any]] = field(default_factory=list)
    generated_ns: int = 0
    ready: object = None  # a lane marker set after HOT; DEFERRED waits for it

    def __len__(self) -> int:
        return len(self.rows)

    def subset(self, positions: list[int]) -> Batch:
        """The same batch restricted to ``positions`` (itself when that is all of it)."""
        if positions == list(range(len(self.rows))):
            return self
        return Batch(
            rows=[self.rows[p] for p in positions],
            sessions=[self.sessions[p] for p in positions],
            chunks=[self.chunks[p] for p in positions],
            conditioning=[self.conditioning[p] for p in positions],
            carry={key: _take(value, positions) for key, value in self.carry.items()},
            generated_ns=self.generated_ns,
            ready=self.ready,
        )


def _take(value: Any, positions: list[int]) -> Any:
    """The rows ``positions`` of one carry value: lists are picked, arrays indexed."""
    if isinstance(value, list):
        return [value[p] for p in positions]
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
    """

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


class OutputAllocator(Protocol):
    """Hands DEFERRED the buffer each chunk is written into, once, in place.

    A transport passes one that returns views of its shared slab, so that the
    serve loop copies nothing. ``discard`` returns a buffer whose chunk will not
    be emitted (the in-flight output of a failed step).
    """

    def allocate(self, session: str, chunk: int) -> np.ndarray[Any, Any]: ...

    def discard(self, session: str, chunk: int, buffer: np.ndarray[Any, Any]) -> None: ...


class HeapAllocator:
    """The default allocator: a fresh NumPy array per chunk."""

    def __init__(self, manifest: Manifest) -> None:
        self._shape = manifest.latent_shape
        self._dtype = np.dtype(manifest.latent_dtype)

    def allocate(self, session: str, chunk: int) -> np.ndarray[Any, Any]:
        return np.empty(self._shape, self._dtype)

    def discard(self, session: str, chunk: int, buffer: np.ndarray[Any, Any]) -> None:
        return None
