"""The shm client: attach to a running daemon from any local process.

    from rte.client import connect

    with connect("mydaemon") as client:
        client.attach("alice", {"prompt": "a forest"})
        for chunk in client.results(timeout=1.0):
            with chunk:                      # releases the slab slot on exit
                frame = chunk.latent         # read-only view into the slab: no copy
            client.act("alice", {"move": (0, 1)})

A client claims one slot of the daemon's client table and owns its ring pair:
requests go out on its inbox ring, chunks and notices come back on its outbox
ring. Calls that wait for a reply (attach, reset, detach) take a timeout; every
wait checks the daemon's pid and start time about every 100 ms, so a dead
daemon is :class:`EngineGone` within about a second, never a hang. Importing
this module never imports torch.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from rte.contract import Manifest, Timing
from rte.control import KIND_CONTROL, KIND_SLAB, Control, DaemonState, client_bell, names
from rte.errors import AdmissionError, RteError
from rte.wire import (
    NoticeCode,
    Record,
    RecordType,
    WireError,
    decode,
    encode,
    encode_value,
)
from shm import (
    Doorbell,
    ForeignSegmentError,
    Ring,
    RingFull,
    Segment,
    SegmentNotFoundError,
    ShmError,
    Slab,
    is_alive,
)
from shm.segment import HEADER_SIZE

LIVENESS_EVERY_S = 0.1
_FINAL = {  # the notices that answer each waiting call
    RecordType.ATTACH: frozenset({NoticeCode.ATTACHED, NoticeCode.REJECTED, NoticeCode.ERROR}),
    RecordType.RESET: frozenset({NoticeCode.ATTACHED, NoticeCode.REJECTED, NoticeCode.ERROR}),
    RecordType.DETACH: frozenset({NoticeCode.DETACHED, NoticeCode.ERROR}),
}


class EngineGone(RteError):
    """The daemon died or stopped: this client can do nothing more. Unrecoverable;
    connect again once a daemon runs."""


class RequestError(RteError):
    """The daemon refused a request (malformed, unknown session, another client's
    session, a model that rejected the conditioning). The client stays usable."""


@dataclass(frozen=True)
class Notice:
    session: str
    code: NoticeCode
    message: str


class Chunk:
    """One chunk of one session. ``latent`` is a read-only view of the slab slot
    the engine wrote it into; it is valid until :meth:`release` (or the end of a
    ``with`` block), after which the slot may be reused."""

    def __init__(
        self,
        client: Client,
        session: str,
        chunk: int,
        latent: np.ndarray[Any, Any],
        timing: Timing,
        slot: int,
        generation: int,
    ) -> None:
        self.session = session
        self.chunk = chunk
        self.latent = latent
        self.timing = timing
        self.slot = slot
        self.generation = generation
        self._client: Client | None = client

    def release(self) -> None:
        """Hand the slot back to the daemon (idempotent)."""
        client, self._client = self._client, None
        if client is not None:
            client._release(self)

    @property
    def released(self) -> bool:
        return self._client is None

    def __enter__(self) -> Chunk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"Chunk({self.session!r}, chunk={self.chunk}, {self.latent.dtype}{self.latent.shape})"
        )


def connect(
    name: str, timeout: float = 5.0, *, policy: str = "spin-then-block", spin_us: float = 50.0
) -> Client:
    """Attach to the daemon ``name``, waiting up to ``timeout`` s for it to be ready."""
    deadline = time.monotonic() + timeout
    n = names(name)
    while True:
        try:
            segment = Segment.open(n["control"], kind=KIND_CONTROL)
            if segment.creator_alive():
                break
            segment.close()  # a dead daemon's leftovers: a new one may be replacing them
            problem = f"daemon {name!r} is dead (its pid {segment.creator_pid} is gone)"
        except (SegmentNotFoundError, ForeignSegmentError):  # absent, or still being made
            problem = f"no daemon named {name!r} (start one with: rte serve --name {name})"
        if time.monotonic() >= deadline:
            raise EngineGone(problem)
        time.sleep(0.02)
    try:
        return Client(name, segment, deadline, policy, spin_us)
    except BaseException:
        segment.close()
        raise


class Client:
    """A connection to one daemon; build with :func:`connect`. Not thread-safe."""

    def __init__(
        self, name: str, segment: Segment, deadline: float, policy: str, spin_us: float
    ) -> None:
        self.name = name
        self._segment = segment
        self._control = Control(segment)
        self._daemon = (segment.creator_pid, segment.creator_start)
        self._checked = 0.0
        while self._control.state is not DaemonState.READY:
            self._check()
            if time.monotonic() >= deadline:
                raise EngineGone(f"daemon {name!r} did not become ready in time")
            time.sleep(0.01)
        self.manifest: Manifest = self._control.manifest()
        me = psutil.Process()
        index = self._control.claim(me.pid, me.create_time())
        if index is None:
            raise AdmissionError(
                f"daemon {name!r} serves {self._control.layout.max_clients} clients already; "
                "close one or start the daemon with more --max-clients"
            )
        self.index = index
        layout = self._control.layout
        self._slab_segment = Segment.open(names(name)["slab"], kind=KIND_SLAB)
        self._slab = Slab(self._slab_segment, HEADER_SIZE)
        self._bell = Doorbell(names(name)["bell"])
        self._my_bell = Doorbell(client_bell(name, index))
        self._inbox = Ring(segment, layout.inbox(index), doorbell=self._bell, policy=policy)
        self._outbox = Ring(
            segment, layout.outbox(index), doorbell=self._my_bell, policy=policy, spin_us=spin_us
        )
        self._bell.ring()  # wake an idle daemon so it adopts us now
        self._seq = 0
        self._chunks: collections.deque[Chunk] = collections.deque()
        self._notices: collections.deque[Notice] = collections.deque()
        self._replies: dict[int, Notice] = {}
        self._waiting: dict[int, frozenset[NoticeCode]] = {}
        self._held: set[Chunk] = set()
        self.sessions: set[str] = set()
        self._closed = False
        self._dtype = np.dtype(self.manifest.latent_dtype)

    # -- sessions ---------------------------------------------------------

    def attach(
        self, session: str, conditioning: Mapping[str, Any] | None = None, *, timeout: float = 5.0
    ) -> None:
        """Attach a session; AdmissionError at capacity, RequestError if refused."""
        self._call(RecordType.ATTACH, session, dict(conditioning or {}), timeout)
        self.sessions.add(session)

    def act(self, session: str, conditioning: Mapping[str, Any], *, timeout: float = 1.0) -> None:
        """Send an action; it applies at the session's next step. Does not wait for
        a reply: a refusal arrives later as a notice (see :meth:`notices`)."""
        self._send(RecordType.ACT, session, encode_value(dict(conditioning)), timeout)

    def reset(
        self, session: str, conditioning: Mapping[str, Any] | None = None, *, timeout: float = 5.0
    ) -> None:
        """Restart the session from chunk 0 (new conditioning, or its last)."""
        self._call(RecordType.RESET, session, conditioning, timeout)

    def detach(self, session: str, *, timeout: float = 5.0) -> None:
        """Detach a session; its in-flight chunk still arrives first."""
        self._call(RecordType.DETACH, session, None, timeout)
        self.sessions.discard(session)

    # -- results ----------------------------------------------------------

    def poll(self, timeout: float = 1.0) -> Chunk | None:
        """The next chunk, waiting up to ``timeout`` s; None if none came."""
        if not self._chunks:
            deadline = time.monotonic() + timeout
            self._pump(timeout)
            while not self._chunks:  # only notices came: keep waiting for a chunk
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._pump(left)
        return self._take()

    def results(self, timeout: float = 1.0) -> Iterator[Chunk]:
        """Chunks as they come; stops after ``timeout`` s without one."""
        while (chunk := self.poll(timeout)) is not None:
            yield chunk

    def notices(self) -> list[Notice]:
        """Drain the notices that were not replies to a waiting call (errors of
        actions, idle detaches, engine-wide errors)."""
        self._pump(0.0)
        out = list(self._notices)
        self._notices.clear()
        return out

    def held(self) -> int:
        """Chunks handed out by poll/results and not yet released."""
        return len(self._held)

    # -- lifecycle --------------------------------------------------------

    def close(self) -> None:
        """Detach every session, release every chunk, give back the client slot."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._daemon_alive():
                for chunk in [*self._held, *self._chunks]:
                    chunk.release()
                self._inbox.push(encode(RecordType.BYE, ""), timeout=1.0)
        except (ShmError, EngineGone):
            pass  # the daemon reaps what we could not say goodbye to
        finally:
            for closer in (self._slab_segment.close, self._segment.close):
                closer()
            self._bell.close()
            self._my_bell.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------

    def _send(self, kind: RecordType, session: str, body: bytes, timeout: float) -> int:
        if self._closed:
            raise RteError("this client is closed")
        self._check()
        self._seq += 1
        try:
            self._inbox.push(encode(kind, session, self._seq, body=body), timeout, self._check)
        except RingFull:
            raise RingFull(
                f"daemon {self.name!r} is not taking requests (its inbox stayed full for "
                f"{timeout}s)"
            ) from None
        return self._seq

    def _call(
        self, kind: RecordType, session: str, conditioning: Mapping[str, Any] | None, timeout: float
    ) -> None:
        body = b"" if conditioning is None else encode_value(dict(conditioning))
        seq = self._send(kind, session, body, timeout)
        self._waiting[seq] = _FINAL[kind]
        deadline = time.monotonic() + timeout
        try:
            while seq not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"daemon {self.name!r} did not answer {kind.name} in {timeout}s"
                    )
                self._pump(left)
        finally:
            del self._waiting[seq]
        reply = self._replies.pop(seq)
        if reply.code is NoticeCode.REJECTED:
            raise AdmissionError(reply.message)
        if reply.code is NoticeCode.ERROR:
            raise RequestError(reply.message)

    def _pump(self, timeout: float) -> None:
        """Move whatever the outbox holds (waiting up to ``timeout``) into our queues."""
        if timeout > 0:
            records = self._outbox.pop_batch(timeout, self._check)
        else:
            records = self._outbox.pop_batch_nowait()
        if records:
            self._control.note_pop(self.index)
        for raw in records:
            try:
                record = decode(raw)
            except WireError as exc:
                self._notices.append(Notice("", NoticeCode.ERROR, f"undecodable record: {exc}"))
                continue
            if record.type is RecordType.CHUNK:
                self._chunks.append(self._chunk(record))
                continue
            notice = Notice(record.session, NoticeCode(record.code), str(record.value))
            if notice.code is NoticeCode.DETACHED:
                self.sessions.discard(record.session)
            final = self._waiting.get(record.seq)
            if final is None:
                self._notices.append(notice)  # nobody waits for it: an async notice
            elif notice.code in final:
                self._replies[record.seq] = notice
            # else: a step on the way (the DETACHED of a RESET), not its answer

    def _chunk(self, record: Record) -> Chunk:
        ref = record.chunk
        assert ref is not None
        latent = self._slab.view(ref.slot, ref.generation, self._dtype, ref.shape)
        chunk = Chunk(
            self,
            record.session,
            ref.chunk,
            latent,
            Timing(ref.generated_ns, ref.emitted_ns),
            ref.slot,
            ref.generation,
        )
        return chunk

    def _take(self) -> Chunk | None:
        if not self._chunks:
            return None
        chunk = self._chunks.popleft()
        self._held.add(chunk)
        return chunk

    def _release(self, chunk: Chunk) -> None:
        self._held.discard(chunk)
        if not self._closed:
            self._slab.release(chunk.slot, chunk.generation, self.index)
            self._inbox.wake()  # a daemon asleep for want of our free slots steps on

    def _daemon_alive(self) -> bool:
        return is_alive(*self._daemon) and self._control.state is not DaemonState.STOPPING

    def _check(self) -> None:
        """EngineGone if the daemon stopped or died. The state word is read every
        time; the process table (slower) at most every 100 ms."""
        if self._control.state is DaemonState.STOPPING:
            raise EngineGone(f"daemon {self.name!r} is stopping")
        now = time.monotonic()
        if now - self._checked >= LIVENESS_EVERY_S:
            if not is_alive(*self._daemon):
                raise EngineGone(f"daemon {self.name!r} (pid {self._daemon[0]}) died")
            self._checked = now
