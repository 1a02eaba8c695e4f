"""Execution lanes: HOT, DEFERRED and ENCODE.

A lane is where a stage's work runs. With torch and CUDA each lane is a real
CUDA stream (:class:`CudaLanes`); otherwise HOT and DEFERRED run inline, in
order, and ENCODE runs on one background worker thread (:class:`CpuLanes`), the
CPU's analogue of a third stream, so that an over-budget encode cannot stall the
step that keeps the other rows advancing.

Lanes are chosen once, when the engine is built, by a cheap probe that never
imports torch: CUDA lanes are used only when the model has already imported
torch and torch reports CUDA. CUDA streams are thread-local in use, so they are
created lazily on the first call from the stepping thread, not at construction
(the engine is usually built on a loading thread and stepped on a worker).

One step body drives both kinds through this small interface: ``run`` a stage
on a lane, ``mark`` a point on a lane and make another lane ``wait`` for it,
``submit_encode`` for asynchronous encodes, ``publish`` to make DEFERRED output
visible to the host, and ``drain`` before any failure propagates.
"""

from __future__ import annotations

import enum
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Protocol


class Lane(enum.Enum):
    HOT = "hot"  # the critical path: makes the latent
    DEFERRED = "deferred"  # decodes chunk N-1 while HOT makes chunk N
    ENCODE = "encode"  # on-demand: heavy conditioning of the rows whose key changed


class Completion(Protocol):
    """An asynchronous encode: ``done`` never blocks; ``result`` waits and re-raises."""

    def done(self) -> bool: ...

    def result(self) -> None: ...


class Lanes:
    """The interface the step body uses; :class:`CpuLanes` and :class:`CudaLanes` fill it."""

    kind = "none"

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def current(self) -> Lane | None:
        """The lane the calling thread is running a stage on, if any (for tracing)."""
        return getattr(self._local, "lane", None)

    @contextmanager
    def _on(self, lane: Lane) -> Iterator[None]:
        previous = self.current
        self._local.lane = lane
        try:
            yield
        finally:
            self._local.lane = previous

    def run(self, lane: Lane, fn: Callable[[Any], object], arg: Any) -> None:
        raise NotImplementedError

    def mark(self, lane: Lane) -> object:
        """A point on ``lane`` that another lane can wait for (None on the CPU)."""
        return None

    def wait(self, lane: Lane, marker: object) -> None:
        """Make later work on ``lane`` start after ``marker`` (no-op on the CPU)."""

    def hand_over(self, value: object, to: Lane) -> None:
        """Tell the allocator that ``value``, made on one lane, is used on ``to``."""

    def publish(self) -> None:
        """Block until DEFERRED output written so far is visible to the host."""

    def submit_encode(self, fn: Callable[[Any], object], arg: Any) -> Completion:
        raise NotImplementedError

    def drain(self) -> None:
        """Wait until every lane is idle (before a failure propagates, before a detach)."""

    def close(self) -> None:
        """Release lane resources; outstanding encodes are waited for first."""


class _FutureCompletion:
    def __init__(self, future: Future[object]) -> None:
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> None:
        self._future.result()


class CpuLanes(Lanes):
    """HOT and DEFERRED inline on the calling thread; ENCODE on one worker thread."""

    kind = "cpu"

    def __init__(self) -> None:
        super().__init__()
        self._encoder: ThreadPoolExecutor | None = None
        self._outstanding: list[Future[object]] = []

    def run(self, lane: Lane, fn: Callable[[Any], object], arg: Any) -> None:
        local = self._local  # inline rather than _on(): this is the step's hot path
        previous = getattr(local, "lane", None)
        local.lane = lane
        try:
            fn(arg)
        finally:
            local.lane = previous

    def submit_encode(self, fn: Callable[[Any], object], arg: Any) -> Completion:
        if self._encoder is None:
            self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rte-encode")

        def on_encode_lane() -> object:
            with self._on(Lane.ENCODE):
                return fn(arg)

        future = self._encoder.submit(on_encode_lane)
        self._outstanding = [f for f in self._outstanding if not f.done()]
        self._outstanding.append(future)
        return _FutureCompletion(future)

    def drain(self) -> None:
        for future in self._outstanding:
            future.exception()  # waits; the failure itself surfaces through its Completion
        self._outstanding.clear()

    def close(self) -> None:
        self.drain()
        if self._encoder is not None:
            self._encoder.shutdown(wait=True)
            self._encoder = None


class CudaLanes(Lanes):
    """Each lane a CUDA stream, created on first use by the stepping thread.

    Cross-lane order is expressed with CUDA events only (``mark``/``wait``);
    nothing on the hot path synchronizes the device. ``publish`` waits for one
    event on the DEFERRED stream, so a chunk is handed out only after its
    device-to-host copy has completed.
    """

    kind = "cuda"

    def __init__(self) -> None:
        super().__init__()
        import torch  # noqa: PLC0415 (only reached when the model already imported torch)

        self._torch = torch
        self._streams: dict[Lane, Any] = {}

    def _stream(self, lane: Lane) -> Any:
        stream = self._streams.get(lane)
        if stream is None:
            stream = self._torch.cuda.Stream()  # type: ignore[no-untyped-call,unused-ignore]
            self._streams[lane] = stream
        return stream

    def run(self, lane: Lane, fn: Callable[[Any], object], arg: Any) -> None:
        with self._on(lane), self._torch.cuda.stream(self._stream(lane)):
            fn(arg)

    def mark(self, lane: Lane) -> object:
        event = self._torch.cuda.Event()  # type: ignore[no-untyped-call,unused-ignore]
        event.record(self._stream(lane))
        return event

    def wait(self, lane: Lane, marker: object) -> None:
        if marker is not None:
            self._stream(lane).wait_event(marker)

    def hand_over(self, value: object, to: Lane) -> None:
        # A tensor allocated on one stream and read on another must not be
        # recycled by the caching allocator until the reader is done with it.
        if isinstance(value, self._torch.Tensor) and value.is_cuda:
            value.record_stream(self._stream(to))
        elif isinstance(value, dict):
            for item in value.values():
                self.hand_over(item, to)
        elif isinstance(value, list | tuple):
            for item in value:
                self.hand_over(item, to)

    def publish(self) -> None:
        event = self.mark(Lane.DEFERRED)
        event.synchronize()  # type: ignore[attr-defined]

    def submit_encode(self, fn: Callable[[Any], object], arg: Any) -> Completion:
        self.run(Lane.ENCODE, fn, arg)
        return _EventCompletion(self.mark(Lane.ENCODE))

    def drain(self) -> None:
        for stream in self._streams.values():
            stream.synchronize()


class _EventCompletion:
    def __init__(self, event: Any) -> None:
        self._event = event

    def done(self) -> bool:
        return bool(self._event.query())

    def result(self) -> None:
        self._event.synchronize()


def cuda_present() -> bool:
    """True when torch is already imported and reports CUDA. Never imports torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken CUDA install is "no CUDA", not a crash
        return False


def make_lanes(kind: str = "auto") -> Lanes:
    """Lanes of ``kind``: ``"cpu"``, ``"cuda"``, or ``"auto"`` (CUDA when present)."""
    if kind == "auto":
        kind = "cuda" if cuda_present() else "cpu"
    if kind == "cpu":
        return CpuLanes()
    if kind == "cuda":
        return CudaLanes()
    raise ValueError(f"unknown lanes kind {kind!r}; expected 'auto', 'cpu' or 'cuda'")
