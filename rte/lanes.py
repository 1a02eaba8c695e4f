"""Execution lanes: HOT, DEFERRED and ENCODE.

A lane is where a stage's work runs. With torch and CUDA each lane is a real
CUDA stream (:class:`CudaLanes`); otherwise HOT and DEFERRED run inline, in
order, and ENCODE runs on one background worker thread (:class:`CpuLanes`), the
CPU's analogue of a third stream, so that an over-budget encode cannot stall the
step that keeps the other rows advancing.

Lanes are chosen once, when the engine is built, from the model's device
(``model.device``): CUDA streams for a model on ``cuda:N``, CPU lanes for one
on the CPU, whatever else the process has loaded. CUDA lanes drive a backend
of streams and events: torch's (:mod:`rte.torchcuda`), or the simulated device
of :mod:`rte.simcuda`, on which the tests run the whole CUDA code path without
a GPU. Streams are created lazily on the first call from the stepping thread,
not at construction (the engine is usually built on a loading thread and
stepped on a worker), and the device is settled once then.

One step body drives both kinds through this small interface: ``run`` a stage
on a lane, ``mark`` a point on a lane and make another lane ``wait`` for it,
``submit_encode`` for asynchronous encodes, ``publish`` to make DEFERRED output
visible to the host, and ``drain`` before any failure propagates.
"""

from __future__ import annotations

import enum
import os
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
    def device(self) -> str:
        """Where the lanes' work runs: ``cpu``, ``cuda:N``, or ``sim`` (simulated CUDA)."""
        return "cpu"

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

    def output_allocator(self, manifest: Any) -> Any:
        """The allocator an engine on these lanes writes chunks with when it is given
        none (None: the heap's); on CUDA, page-locked blocks."""
        return None


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


class StreamBackend(Protocol):
    """Streams and events as :class:`CudaLanes` uses them: torch's CUDA
    (:class:`rte.torchcuda.TorchCuda`) or the simulated device
    (:class:`rte.simcuda.SimCuda`) that the tests run the engine on."""

    name: str

    def bind_thread(self) -> None: ...

    def stream(self, lane: Lane) -> Any: ...

    def settle(self) -> None: ...

    def launch(self, stream: Any, fn: Callable[[Any], object], arg: Any) -> None: ...

    def record(self, stream: Any) -> Any: ...

    def wait(self, stream: Any, event: Any) -> None: ...

    def query(self, event: Any) -> bool: ...

    def host_wait(self, event: Any) -> None: ...

    def synchronize(self, stream: Any) -> None: ...

    def hand_over(self, value: object, stream: Any) -> None: ...

    def output_allocator(self, manifest: Any) -> Any: ...

    def close(self) -> None: ...


class LanesFault(RuntimeError):
    """The device failed and stays failed (a sticky CUDA error): nothing more can
    run on these lanes. The engine fails closed on it."""


class CudaLanes(Lanes):
    """Each lane a stream of ``backend``, created on first use by the stepping thread.

    Cross-lane order is expressed with events only (``mark``/``wait``); nothing
    on the hot path synchronizes the device. ``publish`` polls one event on the
    DEFERRED stream, so a chunk is handed out only after its device-to-host
    copy has completed. ENCODE's host work runs on a worker thread (its device
    work on the ENCODE stream, after the HOT work already queued, which may
    still read the rows it rewrites), and its failure travels in its
    completion, as on the CPU. Before the first stream is made, the device is
    settled once, so work issued while the model was built (on another thread's
    stream) is complete before HOT reads it.
    """

    kind = "cuda"

    def __init__(self, backend: StreamBackend) -> None:
        super().__init__()
        self.backend = backend
        self._streams: dict[Lane, Any] = {}
        self._encoder: ThreadPoolExecutor | None = None
        self._outstanding: list[Future[object]] = []

    @property
    def device(self) -> str:
        return self.backend.name

    def _stream(self, lane: Lane) -> Any:
        stream = self._streams.get(lane)
        if stream is None:
            if not self._streams:
                self.backend.bind_thread()
                self.backend.settle()  # the model's initialisation, on whatever stream it ran
            stream = self._streams[lane] = self.backend.stream(lane)
        return stream

    def run(self, lane: Lane, fn: Callable[[Any], object], arg: Any) -> None:
        def on_lane(value: Any) -> None:  # where the stage runs, which may be later
            with self._on(lane):
                fn(value)

        self.backend.launch(self._stream(lane), on_lane, arg)

    def mark(self, lane: Lane) -> object:
        return self.backend.record(self._stream(lane))

    def wait(self, lane: Lane, marker: object) -> None:
        if marker is not None:
            self.backend.wait(self._stream(lane), marker)

    def hand_over(self, value: object, to: Lane) -> None:
        self.backend.hand_over(value, self._stream(to))

    def publish(self) -> None:
        self.backend.host_wait(self.mark(Lane.DEFERRED))

    def output_allocator(self, manifest: Any) -> Any:
        return self.backend.output_allocator(manifest)

    def submit_encode(self, fn: Callable[[Any], object], arg: Any) -> Completion:
        stream = self._stream(Lane.ENCODE)
        after = self.mark(Lane.HOT)  # HOT work queued so far may read the rows re-encoded
        if self._encoder is None:
            self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rte-encode")

        def on_encode_lane() -> object:
            self.backend.bind_thread()
            self.backend.wait(stream, after)
            self.run(Lane.ENCODE, fn, arg)
            return self.backend.record(stream)

        future = self._encoder.submit(on_encode_lane)
        self._outstanding = [f for f in self._outstanding if not f.done()]
        self._outstanding.append(future)
        return _EventCompletion(self.backend, future)

    def drain(self) -> None:
        """Wait for every lane. Raises the first error the device reported, once;
        :class:`LanesFault` when the device keeps failing (a sticky error)."""
        for future in self._outstanding:
            future.exception()  # the host side of encodes; failures travel in completions
        self._outstanding.clear()
        first: BaseException | None = None
        for stream in self._streams.values():
            try:
                self.backend.synchronize(stream)
            except Exception as exc:
                first = first or exc
        if first is None:
            return
        try:  # an error that is reported once was the work's; one that stays is the device's
            for stream in self._streams.values():
                self.backend.synchronize(stream)
        except Exception as again:
            raise LanesFault(f"the device failed: {again}") from again
        raise first

    def close(self) -> None:
        try:
            self.drain()
        finally:
            if self._encoder is not None:
                self._encoder.shutdown(wait=True)
                self._encoder = None
            self._streams.clear()
            self.backend.close()


class _EventCompletion:
    """An encode on CUDA lanes: its host side (a future) then its device side (an event)."""

    def __init__(self, backend: StreamBackend, future: Future[object]) -> None:
        self._backend = backend
        self._future = future
        self._error: BaseException | None = None

    def done(self) -> bool:
        if not self._future.done():
            return False
        if self._future.exception() is not None or self._error is not None:
            return True
        try:
            return self._backend.query(self._future.result())
        except Exception as exc:  # the device side failed: done, and result() says so
            self._error = exc
            return True

    def result(self) -> None:
        event = self._future.result()
        if self._error is not None:
            raise self._error
        self._backend.host_wait(event)


def make_lanes(kind: str = "auto", device: str = "cpu") -> Lanes:
    """Lanes of ``kind`` for a model on ``device``.

    ``"auto"`` follows the device: CUDA streams for ``cuda`` / ``cuda:N``, else
    CPU lanes, or simulated CUDA streams when ``RTE_LANES=sim`` is set (how
    the tests run the CUDA path on the CPU). ``"cpu"``, ``"cuda"`` and ``"sim"``
    choose directly.
    """
    if kind == "auto":
        if device.startswith("cuda"):
            kind = "cuda"
        else:
            kind = "sim" if os.environ.get("RTE_LANES") == "sim" else "cpu"
    if kind == "cpu":
        return CpuLanes()
    if kind == "cuda":
        from rte.torchcuda import TorchCuda  # noqa: PLC0415 (imports torch)

        return CudaLanes(TorchCuda(device if device.startswith("cuda") else "cuda"))
    if kind == "sim":
        from rte.simcuda import SimCuda  # noqa: PLC0415 (a cycle: it names the lanes)

        return CudaLanes(SimCuda())
    raise ValueError(f"unknown lanes kind {kind!r}; expected 'auto', 'cpu', 'cuda' or 'sim'")
