"""RemoteMember: a caller's end of one host's :class:`~rte.ray.relay.Relay`.

The caller's side of a daemon on another node. Requests go to the host as
actor calls that are not waited on (their answers come back as notices, in the
stream, for the caller's client core to sort: so an attach waits for its
ATTACHED exactly as over shared memory). Arrivals come pushed: one thread per
member iterates the host's streaming generator, puts each message on a queue
and writes an eventfd, so the caller's wait (a ``poll`` over its local
daemons' FIFOs and these eventfds, or an event loop's ``add_reader``) wakes
for them as for any other arrival, and nothing asks the host for chunks.
Releases are gathered and given back in one actor call (:meth:`RemoteMember.flush`):
before the caller sleeps, at a receive that finds nothing come (a caller that
polls without waiting never sleeps), or once half a window's rows are gathered
(the host gives rows back early, up to a window per session:
:mod:`rte.ray.window`), so a caller reading flat out makes one call per several
chunks, not one per step.

States cross through Ray's object store, never an actor call's arguments: an
attach moving a session in puts the state's bytes there (``ray.put``, this
caller the owner) and sends the host a :class:`~rte.ray.relay.StoredState`
(the ObjectRef), which the host fetches; an export's state arrives as an
:class:`~rte.ray.relay.Exported` (the host's ObjectRef) just before its
EXPORTED notice, and is fetched here only when the caller asks for it
(:meth:`RemoteMember.state`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from typing import Any

import numpy as np

from rte.client.batch import ChunkBatch, Release
from rte.client.inputs import by_reference
from rte.client.transport import Arrival
from rte.contract import Manifest, Notice
from rte.errors import EngineGone, RequestError
from rte.protocol.inputs import with_conditioning
from rte.protocol.requests import STATE_KEY, Attach, Export, Request
from rte.protocol.wire import encode_request
from rte.ray.relay import Ended, Exported, Message, Step, StoredState
from rte.ray.window import WINDOW
from rte.state import SessionState

OPEN_TIMEOUT_S = 30.0
JOIN_TIMEOUT_S = 5.0

log = logging.getLogger("rte.ray")


class RemoteLease:
    """A remote batch's hold: the member whose host gives its rows back, and which batch."""

    __slots__ = ("ident", "member")

    def __init__(self, member: RemoteMember, ident: int) -> None:
        self.member = member
        self.ident = ident


class RemoteMember:
    """Caller ``owner``'s slot at ``host``'s daemon ``name``, streamed; see the module."""

    def __init__(self, ray: Any, host: Any, name: str, owner: str, window: int = WINDOW) -> None:
        self.ray, self.host, self.name, self.owner = ray, host, name, owner
        self.flush_rows = max(1, window // 2)  # releases gathered before one is sent unasked
        try:
            opened = host.open.remote(owner, window)
            self.manifest: Manifest = ray.get(opened, timeout=OPEN_TIMEOUT_S)
        except Exception as exc:
            raise EngineGone(f"the host of daemon {name!r} did not open a slot: {exc}") from None
        self.closed = False
        self.ended = ""  # why the stream ended (the daemon or its node gone)
        self._queue: collections.deque[Message] = collections.deque()
        self._releases: list[tuple[int, np.ndarray[Any, Any]]] = []
        self._gathered = 0  # rows in _releases
        self.states: dict[int, Any] = {}  # seq of an export -> its state's ObjectRef
        self._abandoned: set[int] = set()  # exports whose caller stopped waiting
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._fd_lock = threading.Lock()  # the reader writes it, close closes it
        self._stream = host.stream.remote(owner)
        self._reader = threading.Thread(target=self._read, name=f"rte-ray-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """On the reader thread: every message of the stream onto the queue."""
        why = ""
        try:
            for ref in self._stream:
                message: Message = self.ray.get(ref)
                self._queue.append(message)
                self._ring()
                if any(isinstance(item, Ended) for item in message):
                    return
        except Exception as exc:  # the actor (its node) is gone
            why = f"EngineGone: the host of daemon {self.name!r} is gone: {type(exc).__name__}"
        why = why or f"EngineGone: the stream of daemon {self.name!r} ended"
        self._queue.append([Ended(why)])
        self._ring()

    def _ring(self) -> None:
        with self._fd_lock:
            if self._fd >= 0:
                os.eventfd_write(self._fd, 1)

    # -- requests out -----------------------------------------------------------

    def send(self, request: Request, room_s: float = 0.0) -> None:
        """Check it against the wire's limits here (WireError before anything is
        sent), then hand it to the host, not waiting (a state moving in: its bytes
        put in the object store, the host handed their ObjectRef)."""
        if self.ended:
            raise EngineGone(self.ended)
        if not isinstance(request, Export):  # (its slot is the host's to lend)
            encode_request(by_reference(request))
        if isinstance(request, Attach) and STATE_KEY in request.conditioning:
            stored = StoredState(self.ray.put(request.conditioning[STATE_KEY]))
            request = with_conditioning(request, {**request.conditioning, STATE_KEY: stored})
        self.host.send.remote(self.owner, request, room_s)

    # -- arrivals in ------------------------------------------------------------

    def ready(self) -> bool:
        return bool(self._queue)

    def receive(self, release: Release) -> tuple[list[Arrival], str]:
        """What the stream brought, and why it ended ("" while it goes on)."""
        out: list[Arrival] = []
        taken = time.monotonic_ns()
        while self._queue:
            for item in self._queue.popleft():
                if isinstance(item, Step):
                    out.append(self._batch(item, taken, release))
                elif isinstance(item, Notice):
                    out.append(item)
                elif isinstance(item, Exported):
                    if item.seq in self._abandoned:  # answered after its call gave up:
                        self._abandoned.discard(item.seq)  # its ref dropped, never pinned
                        log.warning(
                            "export %d at daemon %r answered late: dropped", item.seq, self.name
                        )
                    else:
                        self.states[item.seq] = item.ref
                else:
                    self.ended = item.why
        return out, self.ended

    def forget(self, seq: int) -> None:
        """Export ``seq`` is done with (read, refused, or given up on): its state's ref
        goes, now or, if its answer is still to come, when it comes."""
        if self.states.pop(seq, None) is None:
            self._abandoned.add(seq)

    def state(self, seq: int, timeout: float = OPEN_TIMEOUT_S) -> SessionState:
        """The state export ``seq`` handed over, fetched from the object store.

        Raises:
            RequestError: none came for it (the host's answer had no state).
            EngineGone: the object store lost it (its host's node is gone).
        """
        ref = self.states.get(seq)  # (dropped by forget, once the export is done with)
        if ref is None:
            raise RequestError(f"export {seq} at daemon {self.name!r}: no state was handed over")
        try:
            data = self.ray.get(ref, timeout=timeout)
        except Exception as exc:
            raise EngineGone(
                f"the state exported by daemon {self.name!r} is lost: {type(exc).__name__}"
            ) from None
        return SessionState.from_bytes(np.ascontiguousarray(data, np.uint8).tobytes())

    def _batch(self, step: Step, taken: int, release: Release) -> ChunkBatch:
        for column in (step.latents, step.chunks, step.generated_ns):
            with contextlib.suppress(ValueError):  # (one from the object store is already)
                column.flags.writeable = False
        return ChunkBatch(
            step.sessions,
            step.chunks,
            step.latents,
            step.generated_ns,
            emitted_ns=step.emitted_ns,
            pushed_ns=step.pushed_ns,
            taken_ns=taken,
            release=release,
            lease=RemoteLease(self, step.ident),
            applied=step.applied if step.applied.any() else None,
        )

    def give_back(self, ident: int, rows: np.ndarray[Any, Any]) -> None:
        self._releases.append((ident, rows))
        self._gathered += len(rows)

    def flush(self, *, force: bool = True) -> None:
        """The releases gathered since the last flush, to the host in one call (not
        ``force``: only once :attr:`flush_rows` are gathered)."""
        if not force and self._gathered < self.flush_rows:
            return
        if self._releases and not self.ended:
            self.host.give_back.remote(self.owner, self._releases)
        self._releases, self._gathered = [], 0

    # -- waiting --------------------------------------------------------------

    def wake_fd(self) -> int:
        return self._fd

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError), self._fd_lock:
            if self._fd >= 0:
                os.eventfd_read(self._fd)

    # -- leaving --------------------------------------------------------------

    def close(self) -> None:
        """Leave: the host closes this caller's slot, which ends the stream."""
        if self.closed:
            return
        self.closed = True
        self.flush()
        if not self.ended:
            with contextlib.suppress(Exception):
                self.ray.get(self.host.close.remote(self.owner), timeout=JOIN_TIMEOUT_S)
        self._reader.join(JOIN_TIMEOUT_S)
        if self._reader.is_alive():  # a host that did not answer: stop reading it
            with contextlib.suppress(Exception):
                self.ray.cancel(self._stream)
        with self._fd_lock:
            os.close(self._fd)
            self._fd = -1
