"""InProcessClient: the EngineClient interface over an engine in this process.

The engine is driven by :func:`rte.serve.default_serve` on a thread of its own
(which steps it for its whole life, as CUDA streams want), through two
``queue.Queue`` s: requests in, chunks and notices out. No copy is made: a
chunk's latent is the array the engine wrote (made read-only).

Backpressure, as in the daemon: a client may hold at most ``quota`` chunks
received and not released; past it no session is due, so a caller that stops
reading stalls its sessions instead of growing memory. Releasing a chunk below
the quota wakes the loop. Requests are held to the wire's limits (session id
length, sendable values), so both client forms refuse the same requests, and
at most ``INBOX_LIMIT`` wait for the loop.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any

from rte.client.base import Chunk, EngineClient
from rte.contract import Engine, Notice, StepResult
from rte.errors import EngineGone, RequestTimeout
from rte.ipc.wire import encode_request
from rte.serve import Request, Stop, Wake, default_serve

STOP_TIMEOUT_S = 30.0
INBOX_LIMIT = 4096  # requests waiting for the loop: past it, a call times out
LIVENESS_EVERY_S = 0.1


class InProcessClient(EngineClient):
    """Serve ``engine`` on a thread of this process; the client owns the engine.

    Args:
        engine: any Level-1 engine (e.g. ``ComposedEngine(ReferenceModel(8))``).
        quota: chunks received and not yet released before sessions stall
            (default: two per row).
        pace_hz: target steps per second; None steps as fast as possible.
    """

    def __init__(
        self, engine: Engine, *, quota: int | None = None, pace_hz: float | None = None
    ) -> None:
        manifest = engine.manifest()
        super().__init__("in-process", manifest)
        self.engine = engine
        self.quota = quota or 2 * manifest.max_sessions
        if self.quota < 1:
            raise ValueError(f"quota must be at least 1, got {self.quota}")
        self._inbox: queue.Queue[Request | Stop | Wake] = queue.Queue(INBOX_LIMIT)
        self._outbox: queue.Queue[StepResult | Notice] = queue.Queue()
        self._lock = threading.Lock()
        self._unreleased = 0  # chunks put in the outbox and not yet released
        self._thread = threading.Thread(
            target=self._serve, args=(pace_hz,), name="rte-inprocess", daemon=True
        )
        self._failure: BaseException | None = None
        self._thread.start()

    def _serve(self, pace_hz: float | None) -> None:
        try:
            default_serve(self.engine, self._inbox, _Counted(self), pace_hz=pace_hz, due=self._due)
        except BaseException as exc:  # the client must say why its engine is gone
            self._failure = exc

    def _due(self, sessions: list[str]) -> list[str]:
        return sessions if self._unreleased < self.quota else []

    # -- transport --------------------------------------------------------

    def _send(self, request: Request, timeout: float) -> None:
        self._check_alive()
        encode_request(request)  # the wire's limits hold here too: both forms refuse alike
        try:
            self._inbox.put(request, timeout=timeout)
        except queue.Full:
            raise RequestTimeout(
                f"the engine is not taking requests: {INBOX_LIMIT} wait already ({timeout}s)"
            ) from None

    def _receive(self, timeout: float) -> list[Chunk | Notice]:
        items: list[StepResult | Notice] = []
        deadline = time.monotonic() + timeout
        while True:
            try:  # in slices, so that a loop that ended is noticed within one
                wait = min(deadline - time.monotonic(), LIVENESS_EVERY_S)
                items.append(self._outbox.get(timeout=wait) if wait > 0 else self._next())
                break
            except queue.Empty:
                self._check_alive()
                if time.monotonic() >= deadline:
                    return []
        try:
            while True:
                items.append(self._next())
        except queue.Empty:
            pass
        return [self._chunk(i) if isinstance(i, StepResult) else i for i in items]

    def _next(self) -> StepResult | Notice:
        return self._outbox.get_nowait()

    def _chunk(self, result: StepResult) -> Chunk:
        latent = result.latent
        assert latent is not None
        latent.flags.writeable = False
        return Chunk(result.session, result.chunk, latent, result.timing, self._release)

    def _release(self, chunk: Chunk) -> None:
        self._released(chunk)
        with self._lock:
            self._unreleased -= 1
            woke = self._unreleased == self.quota - 1
        if woke:
            with contextlib.suppress(queue.Full):  # a full inbox wakes the loop anyway
                self._inbox.put_nowait(Wake())

    def _shutdown(self) -> None:
        with contextlib.suppress(queue.Full):
            self._inbox.put(Stop(), timeout=STOP_TIMEOUT_S)
        self._thread.join(STOP_TIMEOUT_S)
        close = getattr(self.engine, "close", None)
        if close is not None and not self._thread.is_alive():
            close()

    def _check_alive(self) -> None:
        if not self._thread.is_alive():
            reason = f": {self._failure!r}" if self._failure is not None else ""
            raise EngineGone(f"the in-process serve loop has ended{reason}")

    def _count(self, n: int) -> None:
        with self._lock:
            self._unreleased += n


class _Counted:
    """The loop's outbox: counts the chunks that go out against the quota."""

    def __init__(self, client: InProcessClient) -> None:
        self.client = client
        self.queue = client._outbox

    def put(self, item: Any) -> None:
        if isinstance(item, StepResult):
            self.client._count(1)
        self.queue.put(item)
