"""CPU lanes: HOT and DEFERRED inline, in order; ENCODE on one worker thread.

The CPU's analogue of a third stream: an over-budget encode runs beside the
step that keeps the other rows advancing, and cannot stall it. Its failure
travels in its :class:`~rte.lanes.base.Completion`, never through the step.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rte.lanes.base import Completion, Lane, Lanes


class FutureCompletion:
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
        return FutureCompletion(future)

    def drain(self) -> None:
        for future in self._outstanding:
            future.exception()  # waits; the failure itself surfaces through its Completion
        self._outstanding.clear()

    def close(self) -> None:
        self.drain()
        if self._encoder is not None:
            self._encoder.shutdown(wait=True)
            self._encoder = None
