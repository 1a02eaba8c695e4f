"""The public contract every engine keeps (the seed's Level 1 and Level 2).

Level 1 is :class:`Engine`: ``manifest / attach / step(due) / finalize /
detach``. ``step`` is batched: it returns exactly one :class:`StepResult` per
due session, whether or not that session emitted a chunk this step (a
pipelined engine's first step emits nothing; the result then says why).

Level 2 is the loop. An engine that has a ``serve(inbox, outbox)`` method runs
its own; any other is driven by :func:`rte.serve.default_serve`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Manifest:
    """What an engine promises about itself; stable for the engine's life.

    Attributes:
        max_sessions: rows in the arena; attach beyond it raises AdmissionError.
        pipeline_depth_chunks: 2 when decoding overlaps generation (the first
            step emits nothing and every later step emits chunk N-1), else 1.
        input_latency_chunks: how many generated chunks pass before one
            reflects an action (1: the next chunk generated reflects it).
        latent_dtype: NumPy dtype name of each emitted chunk (``StepResult.latent``).
        latent_shape: shape of each emitted chunk; a transport sizes its slots from it.
        model: a short name of the model, for display.
    """

    max_sessions: int
    pipeline_depth_chunks: int
    input_latency_chunks: int
    latent_dtype: str
    latent_shape: tuple[int, ...]
    model: str = ""

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.pipeline_depth_chunks not in (1, 2):
            raise ValueError(
                f"pipeline_depth_chunks must be 1 or 2, got {self.pipeline_depth_chunks}"
            )
        np.dtype(self.latent_dtype)  # raises TypeError on a bad name

    @property
    def pipelined(self) -> bool:
        return self.pipeline_depth_chunks == 2

    @property
    def latent_nbytes(self) -> int:
        return int(np.dtype(self.latent_dtype).itemsize * int(np.prod(self.latent_shape)))


class ResultKind(enum.Enum):
    """Why a :class:`StepResult` does or does not carry a chunk."""

    CHUNK = "chunk"  # ``latent`` holds chunk ``chunk``
    WARMUP = "warmup"  # generated a chunk that the next step will emit
    PENDING = "pending"  # attached, waiting to be seeded (``seed_ready`` said not yet)
    ENCODING = "encoding"  # sitting out while a heavy conditioning change encodes
    ERROR = "error"  # the engine serving this session failed this step (``error`` says how)
    # the session's own encode or seed failed (``error`` says how): the engine freed its
    # row, nobody else lost a chunk; every step it is due says so until it is detached
    FAILED = "failed"


class Timing(NamedTuple):
    """Monotonic timestamps (``time.monotonic_ns``) of one chunk.

    ``generated_ns`` is when the step that generated the chunk began;
    ``emitted_ns`` when the step that emits it returned it; ``pushed_ns`` when a
    transport pushed the chunk's record, and ``taken_ns`` when the client took
    it (0 until then: a transport fills them with ``_replace``). A named tuple:
    immutable and cheap to make; all rows of one batch share one.
    """

    generated_ns: int
    emitted_ns: int
    pushed_ns: int = 0
    taken_ns: int = 0

    @property
    def latency_ns(self) -> int:
        return self.emitted_ns - self.generated_ns


class StepResult(NamedTuple):
    """One due session's outcome of one step (a named tuple: immutable, cheap to make).

    Attributes:
        session: the session id.
        chunk: the emitted chunk's index when ``kind`` is CHUNK; -1 for ERROR and FAILED;
            otherwise the number of chunks the session has generated so far.
        kind: whether a chunk is carried, and if not, why.
        latent: the chunk (shape and dtype from the manifest), or None.
        timing: when the chunk was generated and emitted.
        error: the failure's description when ``kind`` is ERROR.
        applied: the ``seq`` of the last action applied to the session before
            this chunk was generated (0: none); set by the serve loop.
    """

    session: str
    chunk: int
    kind: ResultKind
    latent: np.ndarray[Any, Any] | None
    timing: Timing
    error: str | None = None
    applied: int = 0

    @property
    def has_chunk(self) -> bool:
        return self.kind is ResultKind.CHUNK


class NoticeKind(enum.IntEnum):
    """What a :class:`Notice` says happened. The values are the wire codes."""

    ATTACHED = 1  # the attach (or reset) took effect
    DETACHED = 2  # the session left (``message`` says why when the engine chose it)
    REJECTED = 3  # an attach refused by AdmissionError (backpressure)
    ERROR = 4  # a request or a step failed for this session
    DROPPED = 5  # a chunk could not be emitted (its session goes on or went)
    REDUCED = 6  # overload: the session is stepped at a reduced rate (message: which)
    RESTORED = 7  # the load dropped: the session's rate is raised again (message: to what)
    SUSPENDED = 8  # the session is parked: its row freed, its state in host memory
    RESUMED = 9  # a parked session has a row again (it goes on at its next chunk)
    EXPORTED = 10  # the session's state was handed over (message: its bytes); it left
    DRAINING = 11  # its daemon is draining: move the session elsewhere (a pool does itself)


@dataclass(frozen=True)
class Notice:
    """What happened to a session, other than a chunk.

    Attributes:
        session: the session; "" for the engine as a whole (a failed step).
        kind: what happened.
        message: why, for people (an error's type and text).
        seq: the request this notice answers (its ``seq``), 0 for news that
            answers nothing (an error of a step, a dropped chunk, an idle detach).
    """

    session: str
    kind: NoticeKind
    message: str = ""
    seq: int = 0


@dataclass(frozen=True)
class Action:
    """Action-class conditioning for one session: keys to set on its conditioning.

    The caller has already translated client input into these values; the
    engine never interprets them, it only hands them to the model (cheap keys at
    the next step, heavy keys through the ENCODE lane).
    """

    conditioning: Mapping[str, Any]


@runtime_checkable
class Engine(Protocol):
    """The Level-1 contract. Every method is called from one thread."""

    def manifest(self) -> Manifest: ...

    def attach(self, session: str, conditioning: Mapping[str, Any] | None = None) -> None:
        """Admit a session; raises AdmissionError at capacity; a no-op if attached."""
        ...

    def step(
        self, due: Iterable[str], actions: Mapping[str, Action] | None = None
    ) -> Sequence[StepResult]:
        """Apply ``actions``, advance every due session one chunk, return one result
        each (a list, or a sequence whose results are made when looked at)."""
        ...

    def finalize(self, sessions: Iterable[str] | None = None) -> list[StepResult]:
        """Emit the in-flight chunks of ``sessions`` (default all) without generating more."""
        ...

    def detach(self, session: str) -> None:
        """Release a session's row; raises UnknownSessionError if it is not attached."""
        ...
