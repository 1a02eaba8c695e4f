"""ShmClient: the EngineClient interface over a daemon's shared memory.

    from rte.client import connect

    with connect("mydaemon") as client:
        client.attach("alice", {"prompt": "a forest"})
        for chunk in client.results(timeout=1.0):
            with chunk:                      # releases the slab slot on exit
                frame = chunk.latent         # read-only view into the slab: no copy
            client.act("alice", {"move": (0, 1)})

A client claims a client slot and maps that slot's mailbox, no other's
(:mod:`rte.protocol.mailbox`; the control segment read-only): requests go out on its
inbox ring, chunks and notices come back on its outbox ring: one STEP record
per step, however many sessions, naming the slab slots the engine wrote that
step's chunks into (one run of slots, read in place as one array). A released
batch goes back in one C call; the client counts what it consumed per session
in its credit block, and rings the daemon's doorbell only when the daemon
sleeps for want of this client's credits.

Waiting for a paced daemon (``rte serve --pace-hz``), the client sleeps until
just before the daemon's published next tick, then spins until the step's
record lands: a chunk is held within microseconds of its push, at a few
percent of a core. Every wait checks the daemon's state word, and its pid and
start time about every 100 ms, so a dead daemon is :class:`~rte.errors.EngineGone`
within about a second, never a hang. No ``shm`` exception escapes: each
becomes the :mod:`rte.errors` class that says what it means for the caller.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, cast

import numpy as np
import psutil

from rte.client.base import EngineClient, R
from rte.client.batch import ChunkBatch
from rte.client.daemon import meaning, open_control
from rte.client.inputs import InputLoan, Lender, open_inputs
from rte.contract import Notice, NoticeKind
from rte.errors import AdmissionError, EngineGone, WireError
from rte.protocol.claims import ClaimTable, ClientState
from rte.protocol.control import KIND_CLAIMS, KIND_MAILBOX, KIND_SLAB, Control, DaemonState
from rte.protocol.mailbox import Mailbox
from rte.protocol.names import DaemonNames
from rte.protocol.requests import Request
from rte.protocol.wire import (
    Bye,
    StepColumns,
    decode_reply,
    encode_request,
    reply_handle,
)
from shm import (
    BatchSample,
    Doorbell,
    ForeignSlot,
    RingFull,
    Segment,
    ShmError,
    Slab,
    StaleSlot,
    WaitPolicy,
    is_alive,
)
from shm.fifo import FifoBell
from shm.segment import HEADER_SIZE

LIVENESS_EVERY_S = 0.1
READY_TIMEOUT_S = 5.0  # connect without a timeout: what a starting daemon gets to be ready
LEAVE_TIMEOUT_S = 1.0  # how long close() waits for the daemon to free our slot
TICK_LEAD_NS = 300_000  # a paced daemon: wake this long before its next tick, then spin
TICK_SPIN_NS = 1_000_000  # ... and spin at most this long past it before sleeping again


class _Lease:
    """A batch's hold on its slots, and which sessions (handle, binding) it credits."""

    __slots__ = ("handles", "sample", "tokens")

    def __init__(self, sample: BatchSample, handles: list[int], tokens: list[int]) -> None:
        self.sample = sample
        self.handles = handles
        self.tokens = tokens


class ShmClient(EngineClient):
    """A connection to the daemon ``name``; build it with :func:`rte.client.connect`.

    Args:
        name: the daemon's name.
        timeout: how long to wait for the daemon. None (the default): it must be
            running now (no daemon of that name, or a dead one, is EngineGone at
            once, saying how to start one); one still starting gets
            ``READY_TIMEOUT_S`` to be ready and to free a client slot. A number:
            wait up to that long for it to come up too (a daemon being launched).
        policy: how this client waits for chunks (``spin``, ``spin-then-block``, ``block``).
        spin_us: how long ``spin-then-block`` polls before it sleeps.
        wake: what the daemon rings when this client sleeps: ``semaphore`` (a
            blocking caller) or ``fd``, the slot's FIFO, which an event loop
            waits on (:class:`~rte.client.aio.AsyncClient`).
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        policy: str = "spin-then-block",
        spin_us: float = 50.0,
        wake: str = "semaphore",
    ) -> None:
        if wake not in ("semaphore", "fd"):
            raise ValueError(f"wake must be 'semaphore' or 'fd', not {wake!r}")
        names = DaemonNames(name)
        self._by_fd = wake == "fd"
        self.name = name
        self.index, self._generation = -1, 0  # the client slot, once claimed
        self._mailbox: Mailbox | None = None  # that slot's, once mapped
        deadline = time.monotonic() + (READY_TIMEOUT_S if timeout is None else timeout)
        self._segment = open_control(names, deadline, wait=timeout is not None)
        self._opened: list[Segment | Doorbell | FifoBell] = [self._segment]
        try:
            self._daemon = (self._segment.creator_pid, self._segment.creator_start)
            self._checked = 0.0
            self._control = Control(self._segment)
            super().__init__(name, self._ready_manifest(deadline))
            self._table = self._control.table  # the daemon's roster: read-only here
            claims = self._own(Segment.open(names.claims, kind=KIND_CLAIMS))
            self._claims = ClaimTable(claims, self._control.layout.max_clients)
            self._slab = Slab.open_reader(names.slab, HEADER_SIZE, kind=KIND_SLAB)
            self._own(self._slab.segment)
            self._bell = self._own(Doorbell(names.bell))
            mailbox = self._join(names, deadline, policy, spin_us)
            self._block, self._note_pop = mailbox.block, mailbox.note_pop
            mine = open_inputs(names, self.index, self._own)  # its own input segment alone
            self._lender = Lender(mine, name, self._inbox.max_record)
            self._bell.ring()  # wake an idle daemon so that it adopts us now
        except BaseException as exc:
            self._give_back_slot()
            self._close_mappings()
            if isinstance(exc, ShmError):
                raise meaning(exc, f"joining daemon {name!r}") from None
            raise
        self._dtype = np.dtype(self.manifest.latent_dtype)
        self._shape = self.manifest.latent_shape
        self._paced_wait = policy == WaitPolicy.SPIN_THEN_BLOCK.value
        sessions = self._control.layout.max_sessions
        self._names: list[str | None] = [None] * sessions  # by handle, as ATTACHED said
        self._handle_of: dict[str, int] = {}
        self._tokens = [0] * sessions  # bindings of each handle so far

    def _join(self, names: DaemonNames, deadline: float, policy: str, spin_us: float) -> Mailbox:
        """Claim a client slot, map its mailbox and empty it, and activate it
        (claiming again in the rare case the daemon took a slow claim for abandoned)."""
        me = psutil.Process()
        sizes = (self._control.layout.ring_capacity, self._control.layout.max_sessions)
        while True:
            self.index, self._generation = self._claim(me.pid, me.create_time(), deadline)
            my_bell: Doorbell | FifoBell
            if self._by_fd:
                my_bell = self._fifo = FifoBell(names.client_wake(self.index))
                self._own(my_bell)
                self._fifo.drain()  # what it was rung for a previous holder of the slot
            else:
                my_bell = self._own(Doorbell(names.client_bell(self.index)))
            mine = self._own(Segment.open(names.mailbox(self.index), kind=KIND_MAILBOX))
            # ours alone until it is ACTIVE: laid out anew, whatever a previous holder left
            wait: dict[str, Any] = {"doorbell": my_bell, "policy": policy, "spin_us": spin_us}
            mailbox = Mailbox.open(mine, *sizes, fresh=True, inbox_bell=self._bell, **wait)
            self._mailbox, self._inbox, self._outbox = mailbox, mailbox.inbox, mailbox.outbox
            if self._claims.activate(self.index, self._generation):
                return mailbox
            for thing in (mine, my_bell):
                self._opened.remove(thing)
                thing.close()
            self._mailbox = None

    def _give_back_slot(self) -> None:
        """A failed connect: the claim (or the slot, if active already) goes back."""
        if self.index >= 0:
            with contextlib.suppress(Exception):  # what cannot be said, the daemon reaps
                if not self._claims.abandon(self.index, self._generation) and self._mailbox:
                    self._mailbox.leave()

    # -- inputs by slot (rte.client.inputs) ------------------------------

    def loan(self, shape: tuple[int, ...], dtype: Any, *, timeout: float = 1.0) -> InputLoan:
        self._check_open()
        return self._lender.loan(shape, dtype, timeout)

    def _lend(self, request: R, timeout: float) -> R:
        return self._lender.lend_request(request, timeout)

    def _unlend(self, request: Request) -> None:
        self._lender.unsent(request)

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
        claims, roster = self._claims, self._table
        while (claimed := claims.claim(pid, start, roster, wakes_by_fd=self._by_fd)) is None:
            busy = {e.state for e in claims.entries()} | {e.state for e in roster.entries()}
            if not busy & {ClientState.CLOSING, ClientState.CLAIMED} or (
                time.monotonic() >= deadline
            ):
                raise AdmissionError(
                    f"daemon {self.name!r} serves {roster.max_clients} clients "
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
            raise meaning(
                exc, f"sending {type(request).__name__.lower()} to {self.name!r}"
            ) from None

    def _receive(self, timeout: float) -> list[ChunkBatch | Notice]:
        try:
            if timeout > 0 and not self._wait(timeout):
                return []
            records = self._outbox.pop_batch_nowait()
        except ShmError as exc:  # a corrupt ring: the daemon (or a stray writer) broke it
            raise meaning(exc, f"reading from {self.name!r}") from None
        if not records:
            return []
        taken = time.monotonic_ns()
        self._note_pop(taken)
        out: list[ChunkBatch | Notice] = []
        for raw in records:
            try:
                item = decode_reply(raw)  # a STEP: its columns, no NumPy call
                if isinstance(item, StepColumns):
                    out.append(self._batch(item, taken))
                    continue
                out.append(item)
                if item.kind is NoticeKind.ATTACHED:
                    self._bind(item.session, reply_handle(raw))
                elif item.kind is NoticeKind.DETACHED:
                    self._unbind(item.session)
            except (WireError, ShmError, ValueError, IndexError, TypeError) as exc:
                out.append(Notice("", NoticeKind.ERROR, f"unreadable record: {exc}"))
        return out

    def _wait(self, timeout: float) -> bool:
        """Wait for a record by the policy; around a paced daemon's tick, sleep
        until just before it and spin until the step's record lands."""
        ring, check = self._outbox, self._check
        if ring.used():
            return True
        deadline = time.monotonic() + timeout
        tick = self._control.next_tick_ns if self._paced_wait and self.sessions else 0
        if tick:
            now = time.monotonic_ns()
            if tick - TICK_LEAD_NS > now:
                nap = min(timeout, (tick - TICK_LEAD_NS - now) / 1e9)
                if ring.wait_readable(nap, check, WaitPolicy.BLOCK):
                    return True
            left = (tick + TICK_SPIN_NS - time.monotonic_ns()) / 1e9
            spin = min(deadline - time.monotonic(), left)
            if spin > 0 and ring.wait_readable(spin, check, WaitPolicy.SPIN):
                return True
        return ring.wait_readable(max(deadline - time.monotonic(), 0.0), check)

    # -- waiting on an event loop -------------------------------------------

    def _wake_fd(self) -> int:
        if not self._by_fd:
            raise RuntimeError("this client was connected with wake='semaphore': it has no fd")
        return self._fifo.fileno()

    def _arm(self) -> bool:
        ring = self._outbox
        return bool(ring.used()) or ring.prepare_sleep()

    def _disarm(self) -> bool:
        alive = self._fifo.drain()
        self._outbox.end_sleep()
        return alive

    def _check_live(self, alive: bool = True) -> None:
        self._check()
        if not alive:
            self._checked = 0.0  # ask the process table now
            self._check()
            raise EngineGone(f"daemon {self.name!r} (pid {self._daemon[0]}) closed its end")

    def _bind(self, session: str, handle: int) -> None:
        if not 0 <= handle < len(self._names):
            raise WireError(f"ATTACHED {session!r} names handle {handle}, past this daemon's")
        if self._handle_of.get(session) == handle and self._names[handle] == session:
            return  # attached again, no DETACHED between: the daemon kept the binding
        self._unbind(session)
        self._names[handle] = session
        self._handle_of[session] = handle
        self._tokens[handle] += 1

    def _unbind(self, session: str) -> None:
        handle = self._handle_of.pop(session, None)
        if handle is not None and self._names[handle] == session:
            self._names[handle] = None
            self._tokens[handle] += 1  # its chunks released from now on credit nobody

    def _batch(self, step: StepColumns, taken: int) -> ChunkBatch:
        handles = step.handles
        sessions = list(map(self._names.__getitem__, handles))
        if None in sessions:
            raise WireError(f"STEP names handles {handles}, not all attached")
        sample = self._slab.receive_batch(
            self.index, step.slots, step.generations, self._dtype, self._shape
        )
        self._block.histogram.add(taken - step.pushed_ns)
        lease = _Lease(sample, handles, list(map(self._tokens.__getitem__, handles)))
        latents = sample.block if sample.block is not None else sample.rows
        return ChunkBatch(
            cast(list[str], sessions),  # no None left: checked above
            step.chunks,
            latents,
            step.generated_ns,
            emitted_ns=step.emitted_ns,
            pushed_ns=step.pushed_ns,
            taken_ns=taken,
            release=self._release_rows,
            lease=lease,
            applied=step.applied,
        )

    def _give_back(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        lease: _Lease = batch.lease
        whole = len(rows) == len(lease.sample)
        try:
            if whole:
                lease.sample.release()
            else:
                lease.sample.release_rows(rows)
        except (StaleSlot, ForeignSlot):
            return  # not ours any more (reclaimed): nothing to give back or credit
        tokens, tally = self._tokens, self._block.tally
        for row in range(len(rows)) if whole else rows.tolist():
            handle = lease.handles[row]
            if tokens[handle] == lease.tokens[row]:  # not reset or detached since
                tally[handle] += 1
        if self._block.feed():  # the daemon sleeps for want of our credits
            self._bell.ring()

    def _shutdown(self) -> None:
        """Say BYE and wait (bounded) until the daemon has freed our slot, so a
        connect or attach right after close finds the room this client had."""
        mailbox = self._mailbox
        try:
            if mailbox is None:
                return
            if self._table.state(self.index) is ClientState.REVOKED:
                mailbox.leave()  # disconnected already: the daemon frees the slot now
                return
            if self._daemon_alive():
                try:
                    self._inbox.push(encode_request(Bye()), LEAVE_TIMEOUT_S)
                except RingFull:  # it does not read us: leave by the mailbox instead
                    mailbox.leave()
                self._wait_until_freed(time.monotonic() + LEAVE_TIMEOUT_S, mailbox)
        except (ShmError, EngineGone):
            pass  # the daemon reaps what we could not say goodbye to
        finally:
            self._close_mappings()

    def _wait_until_freed(self, deadline: float, mailbox: Mailbox) -> None:
        """Until our slot is FREE (or another's), the deadline, or the daemon is gone
        (``_check`` asks the process table only every 100 ms, not every poll)."""
        while time.monotonic() < deadline:
            if not self._claims.is_held(self.index, self._generation):
                return  # the daemon freed our claim
            if self._table.state(self.index) is ClientState.REVOKED:
                return mailbox.leave()  # we are leaving anyway
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
            reason = self._control.reason
            raise EngineGone(
                f"daemon {self.name!r} is stopping" + (f": {reason}" if reason else "")
            )
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
