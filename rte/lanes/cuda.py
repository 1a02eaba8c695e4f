"""CUDA lanes: each lane a stream of a backend, ordered by events alone.

:class:`CudaLanes` drives a :class:`StreamBackend`: torch's CUDA
(:class:`rte.lanes.torch.TorchCuda`) or the simulated device
(:class:`rte.lanes.sim.SimCuda`), on which the tests run the whole CUDA code
path without a GPU. Streams are created lazily on the first call from the
stepping thread, not at construction (the engine is usually built on a loading
thread and stepped on a worker), and the device is settled once then.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from rte.lanes.base import Completion, Lane, Lanes, LanesFault


class StreamBackend(Protocol):
    """Streams and events as :class:`CudaLanes` uses them: torch's CUDA
    (:class:`rte.lanes.torch.TorchCuda`) or the simulated device
    (:class:`rte.lanes.sim.SimCuda`) that the tests run the engine on."""

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

    def handed_out(self, batches: list[Any]) -> None: ...

    def close(self) -> None: ...


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

    def host_wait(self, marker: object) -> None:
        if marker is not None:
            self.backend.host_wait(marker)

    def handed_out(self, batches: list[Any]) -> None:
        self.backend.handed_out(batches)

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
