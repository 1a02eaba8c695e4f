"""A simulated CUDA device: streams, events, and a race detector for their order.

For tests, and for any CPU model: ``CudaLanes(SimCuda())`` (or ``RTE_LANES=sim``
for a whole process) runs the engine's CUDA code path, every ``mark``/``wait``,
every publish and the ENCODE worker, with NumPy stages, and turns the mistakes
that real streams make silently, and only sometimes, into failures every time.

Work runs when it is launched, on the launching thread (HOT and DEFERRED on the
stepping thread, ENCODE on the encode worker, concurrently with them), so a
stage's exception is raised where it is on CUDA lanes, by the launch, and the
engine's failure handling is the one it has there. What the device would do
out of order is found by analysis instead of by luck: every launch carries a
vector clock (its stream's, joined with the events the stream waited for and
with what the launching thread has seen complete through ``host_wait``,
``query`` or ``synchronize``), and

* a stage touches its batch's rows: HOT, ENCODE and the default stream write
  them, as a model's KV cache, prompt embeddings and initial zero fills are
  written. Two touches from different streams with no event ordering them
  raise :class:`HazardError` at the second launch;
* a HOT batch's ``carry`` is written by HOT; every later read of it, by
  DEFERRED or by host code, must be ordered after that HOT work (an event wait,
  or a host wait on something that followed it), or the read raises
  :class:`HazardError`;
* a batch's frames are written by DEFERRED; when the engine hands them out
  (``handed_out``) the host must have waited for that DEFERRED work, or the
  hand-out raises :class:`HazardError`: no frame is published before it is
  written.

``order`` logs every launch and host wait, with the stream time each reaches,
so a test can check what the host issued before it waited.

A stage that raises :class:`DeviceFault` breaks the device: that launch and
every later call raise :class:`SimCudaError`, as CUDA does after an illegal
memory access.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rte.lanes.base import Lane

HAZARDS: list[str] = []  # every hazard found in this process, for a test to check

Clock = dict[int, int]


class HazardError(AssertionError):
    """Two streams, or a stream and the host, touched the same data unordered."""


class DeviceFault(RuntimeError):
    """Raise it from a stage to break the simulated device (a sticky CUDA error)."""


class SimCudaError(RuntimeError):
    """What every call raises once the simulated device is broken."""


def _join(a: Clock, b: Clock) -> Clock:
    out = dict(a)
    for key, value in b.items():
        if out.get(key, 0) < value:
            out[key] = value
    return out


@dataclass(eq=False)
class SimStream:
    id: int
    lane: str  # "hot", "deferred", "encode" or "default"
    clock: Clock = field(default_factory=dict)


@dataclass(eq=False, frozen=True)
class SimEvent:
    clock: Clock
    lane: str = ""  # the stream it was recorded on, and that stream's time then
    time: int = 0


@dataclass(frozen=True)
class _Touch:
    stream: int
    time: int
    lane: str


class SimCuda:
    """The backend :class:`~rte.lanes.cuda.CudaLanes` drives, simulated on the CPU."""

    name = "sim"

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._streams: list[SimStream] = []
        self._local = threading.local()  # per thread: what it has seen complete; its op
        self._rows: dict[int, _Touch] = {}  # the last write of each row
        self.launches = 0
        self.host_waits = 0  # times the host blocked on the device (an event or a stream)
        self.fault: SimCudaError | None = None
        self.order: list[tuple[str, str, int]] = []  # ("launch"|"host_wait", lane, time)
        self._written: dict[int, tuple[Any, _Touch]] = {}  # id(batch): its last DEFERRED
        self.default = self._new("default")

    # -- the backend interface -----------------------------------------------

    def bind_thread(self) -> None:
        """CUDA's current device is per thread; the simulated device is the only one."""

    def stream(self, lane: Lane) -> SimStream:
        return self._new(lane.value)

    def settle(self) -> None:
        """Wait for all work on the device (``torch.cuda.synchronize``)."""
        for stream in list(self._streams):
            self.synchronize(stream)

    def launch(self, stream: SimStream, fn: Callable[[Any], object], arg: Any) -> None:
        self._check()
        with self._lock:
            clock = _join(stream.clock, self._seen())
            clock[stream.id] = clock.get(stream.id, 0) + 1
            stream.clock = clock
            self.launches += 1
            self.order.append(("launch", stream.lane, clock[stream.id]))
        touch = _Touch(stream.id, clock[stream.id], stream.lane)
        self._check_rows(touch, clock, arg)
        if stream.lane == "deferred" and hasattr(arg, "out"):  # it writes the batch's frames
            with self._lock:
                self._written[id(arg)] = (arg, touch)
        outer = getattr(self._local, "op", None)
        self._local.op = clock  # what a carry read inside the stage is ordered after
        try:
            fn(arg)
        except DeviceFault as exc:
            self.fault = SimCudaError(f"CUDA error: {exc} (simulated; the device stays broken)")
            raise self.fault from exc
        finally:
            self._local.op = outer
        carry = getattr(arg, "carry", None)
        if stream.lane == "hot" and isinstance(carry, dict):
            arg.carry = _GuardedCarry(self, touch, carry)

    def record(self, stream: SimStream) -> SimEvent:
        self._check()
        with self._lock:
            return SimEvent(dict(stream.clock), stream.lane, stream.clock.get(stream.id, 0))

    def wait(self, stream: SimStream, event: SimEvent) -> None:
        self._check()
        with self._lock:
            stream.clock = _join(stream.clock, event.clock)

    def query(self, event: SimEvent) -> bool:
        self._see(event)  # it ran when launched: a query finds it complete, without waiting
        return True

    def host_wait(self, event: SimEvent) -> None:
        self.host_waits += 1
        with self._lock:
            self.order.append(("host_wait", event.lane, event.time))
        self._see(event)

    def handed_out(self, batches: list[Any]) -> None:
        """The host hands out these batches' frames: their DEFERRED work must be seen done."""
        for batch in batches:
            with self._lock:
                _, writer = self._written.pop(id(batch), (None, None))
            if writer is not None and not _ordered(writer, self._seen()):
                _hazard(
                    "a batch's frames were handed out before the deferred work that "
                    "writes them was waited for (publish before its event)"
                )

    def synchronize(self, stream: SimStream) -> None:
        self.host_wait(self.record(stream))

    def hand_over(self, value: object, stream: SimStream) -> None:
        """Nothing to keep alive: NumPy arrays are not recycled under a stream."""

    def output_allocator(self, manifest: Any) -> None:
        """The heap's: host memory is all there is."""
        return None

    def close(self) -> None:
        """Streams are Python objects here: nothing to destroy."""

    # -- the machinery -----------------------------------------------------------

    def _new(self, lane: str) -> SimStream:
        with self._lock:
            stream = SimStream(len(self._streams) + 1, lane)
            self._streams.append(stream)
            return stream

    def _see(self, event: SimEvent) -> None:
        """The calling thread has seen ``event`` complete."""
        self._check()
        with self._lock:
            self._local.seen = _join(self._seen(), event.clock)

    def _seen(self) -> Clock:
        """What the calling thread has seen complete."""
        seen: Clock | None = getattr(self._local, "seen", None)
        if seen is None:
            seen = self._local.seen = {}
        return seen

    def _check(self) -> None:
        if self.fault is not None:
            raise self.fault

    def _check_rows(self, touch: _Touch, clock: Clock, arg: Any) -> None:
        if touch.lane == "deferred":
            return  # DEFERRED reads the carry and writes the output, never the rows
        rows = [arg] if isinstance(arg, int) else list(getattr(arg, "rows", ()))
        with self._lock:
            for row in rows:
                last = self._rows.get(row)
                if last is not None and not _ordered(last, clock):
                    _hazard(
                        f"{touch.lane} writes row {row} that {last.lane} wrote, "
                        "with no event between them (a missing wait_event)"
                    )
                self._rows[row] = touch

    def check_read(self, writer: _Touch) -> None:
        """A read of data ``writer`` made, from the calling thread's context."""
        op = getattr(self._local, "op", None)
        context = op if op is not None else self._seen()
        if not _ordered(writer, context):
            where = "a stage" if op is not None else "host code"
            _hazard(
                f"{where} read a batch's carry before the {writer.lane} work that makes it "
                "was waited for (an event wait, or a host wait on later work)"
            )


def _ordered(before: _Touch, clock: Clock) -> bool:
    return clock.get(before.stream, 0) >= before.time


def _hazard(message: str) -> None:
    HAZARDS.append(message)
    raise HazardError(f"hazard: {message}")


class _GuardedCarry(dict[str, Any]):
    """A HOT batch's carry whose every read checks it is ordered after HOT."""

    def __init__(self, device: SimCuda, writer: _Touch, values: dict[str, Any]) -> None:
        super().__init__(values)
        self._device = device
        self._writer = writer

    def __getitem__(self, key: str) -> Any:
        self._device.check_read(self._writer)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._device.check_read(self._writer)
        return super().get(key, default)

    def items(self) -> Any:
        self._device.check_read(self._writer)
        return super().items()

    def values(self) -> Any:
        self._device.check_read(self._writer)
        return super().values()
