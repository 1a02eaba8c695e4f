"""ShmClient: the EngineClient interface over a daemon's shared memory.

    from rte.client import connect

    with connect("mydaemon") as client:
        client.attach("alice", {"prompt": "a forest"})
        for chunk in client.results(timeout=1.0):
            with chunk:                      # releases the slab slot on exit
                frame = chunk.latent         # read-only view into the slab: no copy
            client.act("alice", {"move": (0, 1)})

:class:`ShmTransport` moves a client's requests and arrivals through the slot
it holds at the daemon (:class:`~rte.client.slot.ClientSlot`): requests go out
on its inbox ring, chunks and notices come back on its outbox ring: one STEP
record per step, however many sessions, naming the slab slots the engine wrote
that step's chunks into (one run of slots, read in place as one array). One
C call pops the records and judges each STEP (whole, its handles in range, its
slots published: :func:`~rte.protocol.steps.step_reader`), and the batch is
viewed from that verdict, the same call timing its delivery; a record that
fails a check, and every record with ``judging`` off (``RTE_PURE_PYTHON=1``),
goes through the Python reference, which decodes and checks it itself and says
what is wrong. From the pop to the caller runs cold, once a step (about a
microsecond a Python operation), so a judged batch is the least that can be
made there: its sessions are what was :class:`~rte.client.slot.Seen` of its
handles, its view of a run is made once, its columns are read when asked, and
the pop is noted for the daemon's idle limit at the next wait or give back. A
released batch goes back in one C call that releases its slots, credits its
sessions in the credit block and says whether the daemon sleeps for want of
this client's credits (then, and only then, the doorbell rings).

Waiting for a paced daemon (``rte serve --pace-hz``), the client sleeps until
just before the daemon's published next tick, then spins until the step's
record lands: a chunk is held within microseconds of its push, at a few
percent of a core. Every wait checks the daemon's liveness, so a dead daemon
is :class:`~rte.errors.EngineGone` within about a second, never a hang. No
``shm`` exception escapes: each becomes the :mod:`rte.errors` class that says
what it means for the caller.
"""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np

from rte.client.base import EngineClient
from rte.client.batch import ChunkBatch, Release
from rte.client.daemon import meaning
from rte.client.inputs import InputLoan
from rte.client.slot import ClientSlot, SampleLease, Seen, StepLease
from rte.client.slot import SlotLease as SlotLease  # noqa: PLC0414 (pool and ray import it)
from rte.client.ticks import TickWait
from rte.client.transport import Arrival, Transport
from rte.contract import Notice, NoticeKind
from rte.errors import EngineGone, WireError
from rte.protocol.control import Control
from rte.protocol.requests import Export, Request
from rte.protocol.steps import FIXED_AT, IN_PLACE, NOT_JUDGED, step_reader
from rte.protocol.wire import (
    STEP,
    STEP_AT,
    StepColumns,
    decode_reply,
    encode_request,
    reply_handle,
)
from rte.state import SessionState
from shm import Counts, Ring, ShmError, WaitPolicy

NOTE_EVERY_NS = 10_000_000  # the pops noted for the daemon's idle limit: one in this long
SEEN_MAX = 4096  # handle sets remembered at once (a client's steps repeat a few)
_FIXED = STEP.unpack_from  # a STEP's n, flags, emitted_ns, pushed_ns


class ShmTransport(Transport):
    """Requests and arrivals through this client's slot at daemon ``name``.

    Args: as :class:`ShmClient`.

    Attributes:
        judging: whether records are popped and judged in C (the default), or
            decoded by the Python reference (``RTE_PURE_PYTHON=1``, or set False).
        reader: the outbox's C reader (:func:`~rte.protocol.steps.step_reader`).
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
        self.slot = slot = ClientSlot(name, timeout, policy, spin_us, wake == "fd")
        self.name, self.manifest = name, slot.manifest
        mailbox = slot.mailbox
        assert mailbox is not None  # joined
        self.control: Control = slot.control
        self.inbox: Ring = mailbox.inbox
        self.outbox: Ring = mailbox.outbox
        block = mailbox.block
        self._block, self._note_pop, self._check = block, mailbox.note_pop, slot.check
        self._unnoted = self._note_due = 0  # a pop not yet noted in the mailbox (see _noted)
        self._consumed = Counts(block.tally)  # a batch's credits in one C call
        self._lender = slot.lender
        self._dtype = np.dtype(self.manifest.latent_dtype)
        self._shape = self.manifest.latent_shape
        self._paced_wait = policy == WaitPolicy.SPIN_THEN_BLOCK.value
        self._ticks = TickWait()  # a paced daemon's: around each tick (rte.client.ticks)
        self._attached = 0  # sessions bound now: a paced wait only when some are
        sessions = self.control.layout.handles  # the sessions it may hold, parked included
        self._names: list[str | None] = [None] * sessions  # by handle, as ATTACHED said
        self._handle_of: dict[str, int] = {}
        self._tokens = [0] * sessions  # bindings of each handle so far
        self._bindings = 0  # changes of any handle's binding so far (see give_back)
        self._every: np.ndarray[Any, Any] | None = None  # the slab's slots as one view
        self._seen: dict[bytes, Seen] = {}  # by a STEP's handle column, until a binding changes
        self._blocks: dict[int, Any] = slot.slab.segment.view_cache()  # runs' views: see _judged
        self._rows = sessions + 1  # (more than a STEP's rows: handles are distinct)
        self.judging = IN_PLACE  # pop and judge STEPs in C (else the Python reference)
        words = {"histogram": block.histogram.words, "counts": block.tally}
        self.reader = step_reader(
            self.outbox,
            slot.slab,
            sessions,
            owner=slot.index,
            starved=block.starved,
            given=block.given,
            **words,
        )

    @property
    def index(self) -> int:
        """The client slot this client holds at the daemon."""
        return self.slot.index

    def free_rows(self) -> int:
        """Rows of the daemon no client's session holds."""
        return self.slot.free_rows()

    # -- requests out -----------------------------------------------------------

    def send(self, request: Request, room_s: float = 0.0) -> None:
        record = encode_request(request)  # WireError (a RequestError) before anything is sent
        self._check()
        try:
            self.inbox.push(record, room_s, self._check)
        except ShmError as exc:
            raise meaning(
                exc, f"sending {type(request).__name__.lower()} to {self.name!r}"
            ) from None

    def loan(self, shape: tuple[int, ...], dtype: Any, timeout: float) -> InputLoan:
        return self._lender.loan(shape, dtype, timeout)

    def lend(self, request: Request, timeout: float) -> Request:
        return self._lender.lend_request(request, timeout)

    def unlend(self, request: Request) -> None:
        if not self.closed:  # (closed: its input segment is unmapped, the daemon reclaims)
            self._lender.unsent(request)

    def export_into(self, request: Export, timeout: float) -> Export:
        return self._lender.export_into(request, timeout)

    def exported(self, request: Export, nbytes: int) -> SessionState:
        return self._lender.exported(request, nbytes)

    def export_done(self, request: Export) -> None:
        if not self.closed:
            self._lender.export_done(request)

    # -- arrivals in ------------------------------------------------------------

    def receive(self, release: Release) -> list[Arrival]:
        try:
            if self.judging:  # one C call: popped, each STEP judged ready or not, and timed
                records = self.reader.pop()
            else:  # the Python reference
                records = [(raw, NOT_JUDGED) for raw in self.outbox.pop_batch_nowait()]
        except ShmError as exc:  # a corrupt ring: the daemon (or a stray writer) broke it
            raise meaning(exc, f"reading from {self.name!r}") from None
        if not records:
            return []
        taken = time.monotonic_ns()
        if taken >= self._note_due:  # noted once the caller holds it (see _noted)
            self._unnoted = taken
        out: list[Arrival] = []
        for raw, first in records:
            try:
                if first != NOT_JUDGED:  # whole, handles in range, slots ready (the C)
                    out.append(self._judged(raw, first, taken, release))
                    continue
                item = decode_reply(raw)  # a STEP: its columns, no NumPy call
                if isinstance(item, StepColumns):
                    out.append(self._batch(item, taken, release))
                    continue
                out.append(item)
                if item.kind is NoticeKind.ATTACHED:
                    self._bind(item.session, reply_handle(raw))
                elif item.kind is NoticeKind.DETACHED:
                    self._unbind(item.session)
            except (WireError, ShmError, ValueError, IndexError, TypeError) as exc:
                out.append(Notice("", NoticeKind.ERROR, f"unreadable record: {exc}"))
        return out

    def _noted(self) -> None:
        """Note a pop in the mailbox (for the daemon's idle limit, in seconds) off
        the path from a record to its caller, at the next wait or give back, and
        at most every NOTE_EVERY_NS."""
        unnoted, self._unnoted = self._unnoted, 0
        self._note_due = unnoted + NOTE_EVERY_NS
        self._note_pop(unnoted)

    def ready(self) -> bool:
        """Whether a record waits (nothing popped)."""
        return bool(self.outbox.used())

    def wait(self, timeout: float) -> bool:
        """Wait for a record by the policy; around a paced daemon's tick, sleep
        until just before it and spin until the step's record lands."""
        ring, check = self.outbox, self._check
        if self._unnoted:
            self._noted()
        try:
            if ring.used():
                return True
            tick = self.control.next_tick_ns if self._paced_wait and self._attached else 0
            if tick:
                return self._ticks.wait(ring, check, tick, timeout)
            return ring.wait_readable(timeout, check)
        except ShmError as exc:
            raise meaning(exc, f"reading from {self.name!r}") from None

    def _batch(self, step: StepColumns, taken: int, release: Release) -> ChunkBatch:
        """The reference: a decoded STEP's slots checked, then viewed."""
        sample = self.slot.slab.receive_batch(
            self.slot.index, step.slots, step.generations, self._dtype, self._shape
        )
        self._block.histogram.add(taken - step.pushed_ns)  # (the C's adds, on its path)
        handles = step.handles
        sessions = list(map(self._names.__getitem__, handles))
        if None in sessions:
            raise WireError(f"STEP names handles {handles}, not all attached")
        tokens = list(map(self._tokens.__getitem__, handles))
        seen = Seen(self, cast(list[str], sessions), handles, tokens, self._bindings)
        lease = SampleLease(sample, seen)
        return ChunkBatch(
            cast(list[str], sessions),  # no None left: checked above
            step.chunks,
            sample.block if sample.block is not None else sample.rows,
            step.generated_ns,
            emitted_ns=step.emitted_ns,
            pushed_ns=step.pushed_ns,
            taken_ns=taken,
            release=release,
            lease=lease,
            applied=step.applied,
        )

    def _judged(self, raw: bytes, first: int, taken: int, release: Release) -> ChunkBatch:
        """A STEP the C judged as it popped it: viewed from its verdict, its
        sessions from what was :class:`Seen` of its handles, its columns read
        only when asked (what runs here runs cold, once a step, before the
        caller holds the batch)."""
        n, _, emitted, pushed, _ = _FIXED(raw, FIXED_AT)
        at = STEP_AT + 32 * n
        key = raw[at : at + 4 * n]  # the handle column
        seen = self._seen.get(key)
        if seen is None:
            seen = self._see(key)
        every, blocks = self._every, self._blocks
        assert every is not None  # (made by _see)
        if first >= 0:  # one run: its view made once (a NumPy call costs ~5 us cold)
            latents = blocks.get(first * self._rows + n)
            if latents is None:
                if len(blocks) >= SEEN_MAX:
                    blocks.clear()
                latents = blocks[first * self._rows + n] = every[first : first + n]
        else:  # ready, not one run
            latents = [every[s] for s in memoryview(raw)[STEP_AT : STEP_AT + 8 * n].cast("Q")]
        lease = StepLease(raw, seen)
        return ChunkBatch.of_record(
            seen.sessions[:], latents, emitted, pushed, taken, release, lease, lease
        )

    def _see(self, key: bytes) -> Seen:
        """What a STEP's handle column names now (WireError unless all attached)."""
        handles = memoryview(key).cast("I").tolist()
        sessions = list(map(self._names.__getitem__, handles))
        if None in sessions:
            raise WireError(f"STEP names handles {handles}, not all attached")
        if self._every is None:  # (a LayoutError as the reference's, at the first batch)
            slab = self.slot.slab
            dt = slab.layout(self._dtype, self._shape)[0]
            self._every = slab.typed(dt, self._shape, True)
        if len(self._seen) >= SEEN_MAX:
            self._seen.clear()
        tokens = list(map(self._tokens.__getitem__, handles))
        seen = Seen(self, cast(list[str], sessions), handles, tokens, self._bindings)
        self._seen[key] = seen
        return seen

    def _bind(self, session: str, handle: int) -> None:
        if not 0 <= handle < len(self._names):
            raise WireError(f"ATTACHED {session!r} names handle {handle}, past this daemon's")
        if self._handle_of.get(session) == handle and self._names[handle] == session:
            return  # attached again, no DETACHED between: the daemon kept the binding
        self._unbind(session)
        self._seen.clear()
        self._names[handle] = session
        self._handle_of[session] = handle
        self._tokens[handle] += 1
        self._bindings += 1
        self._attached += 1

    def _unbind(self, session: str) -> None:
        handle = self._handle_of.pop(session, None)
        if handle is not None and self._names[handle] == session:
            self._seen.clear()
            self._names[handle] = None
            self._tokens[handle] += 1  # its chunks released from now on credit nobody
            self._bindings += 1
            self._attached -= 1

    def give_back(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        lease: SlotLease = batch.lease
        if self._unnoted:
            self._noted()
        seen = lease.seen
        whole = len(rows) == len(seen.handles)
        stands = seen.bindings == self._bindings  # no binding changed since: every row credits
        if isinstance(lease, StepLease):  # one C call: released, credited, the daemon fed
            fed = self.reader.give_back(lease.record, None if whole else rows, stands)
            if fed is None:
                return  # not ours any more (reclaimed): nothing to give back or credit
            if stands:
                if fed:  # the daemon sleeps for want of our credits
                    self.slot.bell.ring()
                return
        else:  # the reference: the sample's release, then the credits
            assert isinstance(lease, SampleLease)
            if not lease.release(rows):
                return
            if stands:
                self._consumed.add_ones(seen.index, None if whole else rows)
        if not stands:  # only rows of bindings that stand credit
            tokens, handles, was = self._tokens, seen.handles, seen.tokens
            live = [r for r in rows.tolist() if tokens[handles[r]] == was[r]]
            self._consumed.add_ones(seen.index, np.array(live, np.int64))
        self._block.credited()  # (the C stamps it in its call)
        if self._block.feed():  # the daemon sleeps for want of our credits
            self.slot.bell.ring()

    # -- waiting on an event loop -------------------------------------------

    def wake_fds(self) -> list[int]:
        if self.slot.fifo is None:
            raise RuntimeError("this client was connected with wake='semaphore': it has no fd")
        return [self.slot.fifo.fileno()]

    def arm(self) -> bool:
        ring = self.outbox
        return bool(ring.used()) or ring.prepare_sleep()

    def disarm(self) -> bool:
        assert self.slot.fifo is not None
        alive = self.slot.fifo.drain()
        self.outbox.end_sleep()
        return alive

    def check_live(self, alive: bool = True) -> None:
        self._check()
        if not alive:
            self.slot.check_now()
            raise EngineGone(f"daemon {self.name!r} (pid {self.slot.daemon[0]}) closed its end")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.slot.leave()


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

    transport: ShmTransport

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        policy: str = "spin-then-block",
        spin_us: float = 50.0,
        wake: str = "semaphore",
    ) -> None:
        transport = ShmTransport(name, timeout=timeout, policy=policy, spin_us=spin_us, wake=wake)
        super().__init__(transport)

    @property
    def index(self) -> int:
        """The client slot this client holds at the daemon."""
        return self.transport.index

    def free_rows(self) -> int:
        """Rows of the daemon no client's session holds (its roster says)."""
        return self.transport.free_rows()
