"""ShmClient: the EngineClient interface over a daemon's shared memory.

    from rte.client import connect

    with connect("mydaemon") as client:
        client.attach("alice", {"prompt": "a forest"})
        for chunk in client.results(timeout=1.0):
            with chunk:                      # releases the slab slot on exit
                frame = chunk.latent         # read-only view into the slab: no copy
            client.act("alice", {"move": (0, 1)})

A client claims one slot of the daemon's client table and owns its ring pair:
requests go out on its inbox ring, chunks and notices come back on its outbox
ring; a chunk is a view of the slab slot the engine wrote it into, released
back in place. Every wait checks the daemon's state word, and its pid and
start time about every 100 ms, so a dead daemon is :class:`~rte.errors.EngineGone`
within about a second, never a hang. No ``shm`` exception escapes: each
becomes the :mod:`rte.errors` class that says what it means for the caller.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np
import psutil

from rte.client.base import Chunk, EngineClient
from rte.contract import Notice, NoticeKind, Timing
from rte.errors import AdmissionError, EngineGone, RequestTimeout, RteError, WireError
from rte.ipc.claims import ClientState
from rte.ipc.control import KIND_CONTROL, KIND_SLAB, Control, DaemonState
from rte.ipc.names import DaemonNames
from rte.ipc.wire import Bye, ChunkRef, decode_reply, encode_request
from rte.serve import Request
from shm import (
    Doorbell,
    ForeignSlot,
    RecordTooLarge,
    Ring,
    RingFull,
    Segment,
    SegmentError,
    SegmentVersionError,
    ShmError,
    Slab,
    SlotRef,
    StaleSlot,
    WouldBlock,
    is_alive,
)
from shm.segment import HEADER_SIZE

LIVENESS_EVERY_S = 0.1
LEAVE_TIMEOUT_S = 1.0  # how long close() waits for the daemon to free our slot


class ShmClient(EngineClient):
    """A connection to the daemon ``name``; build it with :func:`rte.client.connect`.

    Args:
        name: the daemon's name.
        timeout: how long to wait for the daemon to be up and for a client slot.
        policy: how this client waits for chunks (``spin``, ``spin-then-block``, ``block``).
        spin_us: how long ``spin-then-block`` polls before it sleeps.
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float = 5.0,
        policy: str = "spin-then-block",
        spin_us: float = 50.0,
    ) -> None:
        names = DaemonNames(name)
        self.name = name
        self.index, self._generation = -1, 0  # the client slot, once claimed
        deadline = time.monotonic() + timeout
        self._segment = _open_control(names, deadline)
        self._opened: list[Segment | Doorbell] = [self._segment]
        try:
            self._daemon = (self._segment.creator_pid, self._segment.creator_start)
            self._checked = 0.0
            self._control = Control(self._segment)
            super().__init__(name, self._ready_manifest(deadline))
            self._table = self._control.table
            self._slab = Slab.open_reader(names.slab, HEADER_SIZE, kind=KIND_SLAB)
            self._own(self._slab.segment)
            self._bell = self._own(Doorbell(names.bell))
            self._join(names, deadline, policy, spin_us)
            self._bell.ring()  # wake an idle daemon so that it adopts us now
        except BaseException as exc:
            self._give_back_slot()
            self._close_mappings()
            if isinstance(exc, ShmError):
                raise _meaning(exc, f"joining daemon {name!r}") from None
            raise
        self._dtype = np.dtype(self.manifest.latent_dtype)

    def _join(self, names: DaemonNames, deadline: float, policy: str, spin_us: float) -> None:
        """Claim a client slot, set up its rings, and activate it (claiming again
        in the rare case the daemon took a slow claim for abandoned)."""
        me = psutil.Process()
        layout = self._control.layout
        while True:
            self.index, self._generation = self._claim(me.pid, me.create_time(), deadline)
            my_bell = self._own(Doorbell(names.client_bell(self.index)))
            self._inbox = Ring(self._segment, layout.inbox(self.index), doorbell=self._bell)
            self._outbox = Ring(
                self._segment,
                layout.outbox(self.index),
                doorbell=my_bell,
                policy=policy,
                spin_us=spin_us,
            )
            # The slot is ours alone until it is ACTIVE: empty its rings of anything
            # a previous holder wrote after it left, then let the daemon adopt it.
            self._inbox.reset()
            self._outbox.reset()
            if self._table.activate(self.index, self._generation):
                return
            self._opened.remove(my_bell)
            my_bell.close()

    def _give_back_slot(self) -> None:
        """A failed connect: the claim (or the slot, if active already) goes back."""
        if self.index >= 0:
            with contextlib.suppress(Exception):  # what cannot be said, the daemon reaps
                if not self._table.abandon(self.index, self._generation):
                    self._table.leave(self.index, self._generation)

    def _own(self, thing: Any) -> Any:
        self._opened.append(thing)
        return thing

    def _ready_manifest(self, deadline: float) -> Any:
        while self._control.state is DaemonState.STARTING:
            self._check()
            if time.monotonic() >= deadline:
                raise EngineGone(f"daemon {self.name!r} did not become ready in time")
            time.sleep(0.01)
        self._check()
        return self._control.manifest()

    def _claim(self, pid: int, start: float, deadline: float) -> tuple[int, int]:
        """Take a client slot; while one is being freed (a client leaving), wait for it."""
        while (claimed := self._table.claim(pid, start)) is None:
            busy = {entry.state for entry in self._table.entries()}
            if not busy & {ClientState.CLOSING, ClientState.CLAIMED} or (
                time.monotonic() >= deadline
            ):
                raise AdmissionError(
                    f"daemon {self.name!r} serves {self._table.max_clients} clients "
                    "already; close one or start the daemon with more --max-clients"
                )
            self._check()
            time.sleep(0.005)
        return claimed

    # -- transport --------------------------------------------------------

    def _send(self, request: Request, timeout: float) -> None:
        record = encode_request(request)  # WireError (a RequestError) before anything is sent
        self._check()
        try:
            self._inbox.push(record, timeout, self._check)
        except ShmError as exc:
            raise _meaning(
                exc, f"sending {type(request).__name__.lower()} to {self.name!r}"
            ) from None

    def _receive(self, timeout: float) -> list[Chunk | Notice]:
        try:
            if timeout > 0:
                records = self._outbox.pop_batch(timeout, self._check)
            else:
                records = self._outbox.pop_batch_nowait()
        except ShmError as exc:  # a corrupt ring: the daemon (or a stray writer) broke it
            raise _meaning(exc, f"reading from {self.name!r}") from None
        if records:
            self._table.note_pop(self.index)
        out: list[Chunk | Notice] = []
        for raw in records:
            try:
                item = decode_reply(raw)
                out.append(self._chunk(item) if isinstance(item, ChunkRef) else item)
            except (WireError, ShmError, ValueError) as exc:
                out.append(Notice("", NoticeKind.ERROR, f"unreadable record: {exc}"))
        return out

    def _chunk(self, ref: ChunkRef) -> Chunk:
        slot = SlotRef(ref.slot, ref.generation, self.index)
        sample = self._slab.receive(slot, self._dtype, ref.shape)
        timing = Timing(ref.generated_ns, ref.emitted_ns)
        return Chunk(ref.session, ref.chunk, sample.array, timing, self._release, sample)

    def _release(self, chunk: Chunk) -> None:
        self._released(chunk)
        if self.closed:
            return  # the daemon reclaimed our slots when we left
        try:
            chunk.lease.release()
        except (StaleSlot, ForeignSlot):
            return  # not ours any more (reclaimed): nothing to give back
        self._inbox.wake()  # a daemon asleep for want of our free slots steps on

    def _shutdown(self) -> None:
        """Say BYE and wait (bounded) until the daemon has freed our slot, so a
        connect or attach right after close finds the room this client had."""
        try:
            if self._table.give_back_revoked(self.index, self._generation):
                return  # disconnected already: nobody reads our rings
            if self._daemon_alive():
                try:
                    self._inbox.push(encode_request(Bye()), LEAVE_TIMEOUT_S)
                except RingFull:  # it does not read us: leave by the table instead
                    self._table.leave(self.index, self._generation)
                self._wait_until_freed(time.monotonic() + LEAVE_TIMEOUT_S)
        except (ShmError, EngineGone):
            pass  # the daemon reaps what we could not say goodbye to
        finally:
            self._close_mappings()

    def _wait_until_freed(self, deadline: float) -> None:
        """Until our slot is FREE (or another's), the deadline, or the daemon is gone
        (``_check`` asks the process table only every 100 ms, not every poll)."""
        while time.monotonic() < deadline:
            entry = self._table.entry(self.index)
            if entry.state is ClientState.FREE or entry.generation != self._generation:
                return
            if entry.state is not ClientState.REVOKED:  # revoked: we are leaving anyway
                self._check()
            time.sleep(0.001)

    def _close_mappings(self) -> None:
        for thing in reversed(self._opened):
            thing.close()
        self._opened.clear()

    # -- liveness ---------------------------------------------------------

    def _daemon_alive(self) -> bool:
        return is_alive(*self._daemon) and self._control.state is not DaemonState.STOPPING

    def _check(self) -> None:
        """EngineGone if the daemon stopped or died. The state word is read every
        time; the process table (slower) at most every 100 ms."""
        if self._control.state is DaemonState.STOPPING:
            raise EngineGone(f"daemon {self.name!r} is stopping")
        if self.index >= 0 and self._table.state(self.index) is ClientState.REVOKED:
            raise EngineGone(
                f"daemon {self.name!r} disconnected this client: it sent requests without "
                "reading their answers (poll or notices), or broke the protocol; close it "
                "and connect again"
            )
        now = time.monotonic()
        if now - self._checked >= LIVENESS_EVERY_S:
            if not is_alive(*self._daemon):
                raise EngineGone(f"daemon {self.name!r} (pid {self._daemon[0]}) died")
            self._checked = now


def _meaning(exc: ShmError, doing: str) -> RteError:
    """The one place a transport error becomes what it means to a caller: the
    daemon does not take requests (RequestTimeout), this request cannot be sent
    (WireError), or the daemon cannot be reached at all (EngineGone)."""
    if isinstance(exc, WouldBlock):
        return RequestTimeout(f"{doing}: the daemon is not taking requests ({exc})")
    if isinstance(exc, RecordTooLarge):
        return WireError(f"{doing}: {exc}")
    return EngineGone(f"{doing}: {exc}")


def _open_control(names: DaemonNames, deadline: float) -> Segment:
    """The live daemon's control segment, waiting until ``deadline`` for one."""
    while True:
        try:
            segment = Segment.open(names.control, kind=KIND_CONTROL)
            if segment.creator_alive():
                return segment
            segment.close()  # a dead daemon's leftovers: a new one may be replacing them
            problem = f"daemon {names.daemon!r} is dead (its pid {segment.creator_pid} is gone)"
        except SegmentVersionError as exc:  # waiting will not help
            raise EngineGone(str(exc)) from None
        except SegmentError:  # absent, or still being made
            problem = (
                f"no daemon named {names.daemon!r} (start one with: rte serve --name "
                f"{names.daemon})"
            )
        if time.monotonic() >= deadline:
            raise EngineGone(problem)
        time.sleep(0.02)
