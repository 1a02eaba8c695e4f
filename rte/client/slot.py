"""ClientSlot: this client's place at one daemon, from joining to leaving.

A client claims a client slot and maps that slot's mailbox, no other's
(:mod:`rte.protocol.mailbox`; the control segment read-only): the daemon's
control segment (found live by :func:`~rte.client.daemon.open_control`), the
claims table, the slab (read-only), the daemon's doorbell, its own mailbox
(inbox and outbox rings, the credit block) with its wake-up (a semaphore for
a blocking caller, or the slot's FIFO an event loop watches) and its own input
segment. Every mapping is registered as it is opened, so a failed join or a
leave closes exactly what was opened, in reverse.

Joining claims a slot (waiting, bounded, while one is being freed), lays its
mailbox out anew (whatever a previous holder left) and activates it. Leaving
says BYE and waits (bounded) until the daemon has freed the slot, so a connect
right after a close finds the room this client had. Liveness: the daemon's
state word is read at every check, its pid and start time at most every
:data:`LIVENESS_EVERY_S`; a dead or stopping daemon, or one that revoked this
client, is :class:`~rte.errors.EngineGone`.

A batch of chunks it takes from there holds slab slots: a :class:`SlotLease`,
the Python reference's :class:`SampleLease` or the judged path's
:class:`StepLease` (its STEP record itself), with what was :class:`Seen` of the
sessions its rows credit.
"""

from __future__ import annotations

import contextlib
import os
import time
from array import array
from typing import TYPE_CHECKING, Any

import numpy as np

from rte.client.daemon import meaning, open_control
from rte.client.inputs import Lender, open_inputs
from rte.contract import Manifest
from rte.errors import AdmissionError, EngineGone
from rte.protocol.claims import ClaimTable, ClientState
from rte.protocol.control import KIND_CLAIMS, KIND_MAILBOX, KIND_SLAB, Control, DaemonState
from rte.protocol.mailbox import Mailbox
from rte.protocol.names import DaemonNames
from rte.protocol.rows import free_rows
from rte.protocol.steps import judged_step
from rte.protocol.wire import Bye, StepColumns, encode_request
from shm import (
    BatchSample,
    Doorbell,
    ForeignSlot,
    RingFull,
    Segment,
    ShmError,
    Slab,
    StaleSlot,
    is_alive,
    process_start_time,
)
from shm.fifo import FifoBell

if TYPE_CHECKING:
    from rte.client.shm import ShmTransport
from shm.segment import HEADER_SIZE

LIVENESS_EVERY_S = 0.1
READY_TIMEOUT_S = 5.0  # connect without a timeout: what a starting daemon gets to be ready
LEAVE_TIMEOUT_S = 1.0  # how long leaving waits for the daemon to free our slot


class ClientSlot:
    """The slot this client holds at daemon ``name``, mapped; see the module."""

    def __init__(
        self, name: str, timeout: float | None, policy: str, spin_us: float, by_fd: bool
    ) -> None:
        names = DaemonNames(name)
        self.name = name
        self.by_fd = by_fd
        self.index, self.generation = -1, 0  # the client slot, once claimed
        self.mailbox: Mailbox | None = None  # that slot's, once mapped
        self.fifo: FifoBell | None = None  # its wake-up, when an event loop waits
        deadline = time.monotonic() + (READY_TIMEOUT_S if timeout is None else timeout)
        self.segment = open_control(names, deadline, wait=timeout is not None)
        self._opened: list[Segment | Doorbell | FifoBell] = [self.segment]
        try:
            self.daemon = (self.segment.creator_pid, self.segment.creator_start)
            self._checked = 0.0
            self.control = Control(self.segment)
            self.manifest = self._ready_manifest(deadline)
            self.table = self.control.table  # the daemon's roster: read-only here
            claims = self._own(Segment.open(names.claims, kind=KIND_CLAIMS))
            self.claims = ClaimTable(claims, self.control.layout.max_clients)
            self.slab = Slab.open_reader(names.slab, HEADER_SIZE, kind=KIND_SLAB)
            self._own(self.slab.segment)
            self.bell = self._own(Doorbell(names.bell))
            self.mailbox = mailbox = self._join(names, deadline, policy, spin_us)
            mine = open_inputs(names, self.index, self._own)  # its own input segment alone
            self.lender = Lender(mine, name, mailbox.inbox.max_record)
            self.bell.ring()  # wake an idle daemon so that it adopts us now
        except BaseException as exc:
            self._give_back_slot()
            self.close_mappings()
            if isinstance(exc, ShmError):
                raise meaning(exc, f"joining daemon {name!r}") from None
            raise

    # -- joining --------------------------------------------------------------

    def _join(self, names: DaemonNames, deadline: float, policy: str, spin_us: float) -> Mailbox:
        """Claim a client slot, map its mailbox and empty it, and activate it
        (claiming again in the rare case the daemon took a slow claim for abandoned)."""
        me, start = os.getpid(), process_start_time(os.getpid())
        assert start is not None  # (this process runs)
        sizes = (self.control.layout.ring_capacity, self.control.layout.handles)
        while True:
            self.index, self.generation = self._claim(me, start, deadline)
            my_bell: Doorbell | FifoBell
            if self.by_fd:
                my_bell = self.fifo = self._own(FifoBell(names.client_wake(self.index)))
                self.fifo.drain()  # what it was rung for a previous holder of the slot
            else:
                my_bell = self._own(Doorbell(names.client_bell(self.index)))
            mine = self._own(Segment.open(names.mailbox(self.index), kind=KIND_MAILBOX))
            # ours alone until it is ACTIVE: laid out anew, whatever a previous holder left
            wait: dict[str, Any] = {"doorbell": my_bell, "policy": policy, "spin_us": spin_us}
            mailbox = Mailbox.open(mine, *sizes, fresh=True, inbox_bell=self.bell, **wait)
            self.mailbox = mailbox
            if self.claims.activate(self.index, self.generation):
                return mailbox
            for thing in (mine, my_bell):
                self._opened.remove(thing)
                thing.close()
            self.mailbox = None

    def _claim(self, pid: int, start: float, deadline: float) -> tuple[int, int]:
        """Take a client slot; while one is being freed (a client leaving), wait for it."""
        claims, roster = self.claims, self.table
        while (claimed := claims.claim(pid, start, roster, wakes_by_fd=self.by_fd)) is None:
            busy = {e.state for e in claims.entries()} | {e.state for e in roster.entries()}
            if not busy & {ClientState.CLOSING, ClientState.CLAIMED} or (
                time.monotonic() >= deadline
            ):
                raise AdmissionError(
                    f"daemon {self.name!r} serves {roster.max_clients} clients "
                    "already; close one or start the daemon with more --max-clients"
                )
            self.check()
            time.sleep(0.005)
        return claimed

    def _ready_manifest(self, deadline: float) -> Manifest:
        while self.control.state is DaemonState.STARTING:
            self.check()
            if time.monotonic() >= deadline:
                raise EngineGone(f"daemon {self.name!r} did not become ready in time")
            time.sleep(0.01)
        self.check()
        return self.control.manifest()

    def _give_back_slot(self) -> None:
        """A failed join: the claim (or the slot, if active already) goes back."""
        if self.index >= 0:
            with contextlib.suppress(Exception):  # what cannot be said, the daemon reaps
                if not self.claims.abandon(self.index, self.generation) and self.mailbox:
                    self.mailbox.leave()

    def _own(self, thing: Any) -> Any:
        self._opened.append(thing)
        return thing

    # -- what the daemon's table says -----------------------------------------

    def free_rows(self) -> int:
        """Rows of the daemon no client's session holds (its roster says)."""
        return free_rows(self.table, self.manifest.max_sessions)

    # -- liveness -------------------------------------------------------------

    def daemon_alive(self) -> bool:
        return is_alive(*self.daemon) and self.control.state is not DaemonState.STOPPING

    def check(self) -> None:
        """EngineGone if the daemon stopped or died. The state word is read every
        time; the process table (slower) at most every 100 ms."""
        if self.control.state is DaemonState.STOPPING:
            reason = self.control.reason
            raise EngineGone(
                f"daemon {self.name!r} is stopping" + (f": {reason}" if reason else "")
            )
        if self.index >= 0 and self.table.state(self.index) is ClientState.REVOKED:
            raise EngineGone(
                f"daemon {self.name!r} disconnected this client: it sent requests without "
                "reading their answers (poll or notices), or broke the protocol; close it "
                "and connect again"
            )
        now = time.monotonic()
        if now - self._checked >= LIVENESS_EVERY_S:
            if not is_alive(*self.daemon):
                raise EngineGone(f"daemon {self.name!r} (pid {self.daemon[0]}) died")
            self._checked = now

    def check_now(self) -> None:
        """:meth:`check`, asking the process table now."""
        self._checked = 0.0
        self.check()

    # -- leaving --------------------------------------------------------------

    def leave(self) -> None:
        """Say BYE and wait (bounded) until the daemon has freed our slot; then
        close every mapping."""
        mailbox = self.mailbox
        try:
            if mailbox is None:
                return
            if self.table.state(self.index) is ClientState.REVOKED:
                mailbox.leave()  # disconnected already: the daemon frees the slot now
                return
            if self.daemon_alive():
                try:
                    mailbox.inbox.push(encode_request(Bye()), LEAVE_TIMEOUT_S)
                except RingFull:  # it does not read us: leave by the mailbox instead
                    mailbox.leave()
                self._wait_until_freed(time.monotonic() + LEAVE_TIMEOUT_S, mailbox)
        except (ShmError, EngineGone):
            pass  # the daemon reaps what we could not say goodbye to
        finally:
            self.close_mappings()

    def _wait_until_freed(self, deadline: float, mailbox: Mailbox) -> None:
        """Until our slot is FREE (or another's), the deadline, or the daemon is gone
        (``check`` asks the process table only every 100 ms, not every poll)."""
        while time.monotonic() < deadline:
            if not self.claims.is_held(self.index, self.generation):
                return  # the daemon freed our claim
            if self.table.state(self.index) is ClientState.REVOKED:
                return mailbox.leave()  # we are leaving anyway
            self.check()
            time.sleep(0.001)

    def close_mappings(self) -> None:
        for thing in reversed(self._opened):
            thing.close()
        self._opened.clear()


# -- a batch's hold on the slab slots its chunks lie in ---------------------------


class Seen:
    """What ``transport`` knows of one set of handles (a STEP's handle column)
    while no binding changes (``bindings``: its count of changes then): their
    sessions, binding tokens and ``uint32`` index, made once, not per step."""

    __slots__ = ("bindings", "handles", "index", "sessions", "tokens", "transport")

    def __init__(
        self,
        transport: ShmTransport,
        sessions: list[str],
        handles: list[int],
        tokens: list[int],
        bindings: int,
    ) -> None:
        self.transport = transport
        self.sessions = sessions
        self.handles = handles
        self.index = array("I", handles)
        self.tokens = tokens
        self.bindings = bindings


class SlotLease:
    """A batch's hold on its slab slots, and what was :class:`Seen` of the
    sessions its rows credit: given back by ``transport``; ``bindings``: the
    transport's binding changes when it was made (a row credits its session
    only while its binding stands)."""

    __slots__ = ("seen",)

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    @property
    def transport(self) -> ShmTransport:
        return self.seen.transport

    @property
    def bindings(self) -> int:
        return self.seen.bindings


class SampleLease(SlotLease):
    """The Python reference's hold: ``sample``, checked and viewed in Python."""

    __slots__ = ("sample",)

    def __init__(self, sample: BatchSample, seen: Seen) -> None:
        self.sample = sample
        self.seen = seen

    def release(self, rows: np.ndarray[Any, Any]) -> bool:
        """The sample's ``rows`` released (all in one call when they are all of
        them); False when some were not this client's any more (reclaimed:
        nothing to credit)."""
        sample = self.sample
        try:
            if len(rows) == len(sample):
                sample.release()
            else:
                sample.release_rows(rows)
        except (StaleSlot, ForeignSlot):
            return False
        return True


class StepLease(SlotLease):
    """The hold of a batch the C judged: its STEP ``record`` itself, whose
    columns the C reads again to give the slots back and credit them
    (:meth:`shm.steps.RowsReader.give_back`). Two words a step: the rest is
    asked of them."""

    __slots__ = ("record",)

    def __init__(self, record: bytes, seen: Seen) -> None:
        self.record = record
        self.seen = seen

    @property
    def step(self) -> StepColumns:
        """The record's columns (decoded when asked: for tests and tools)."""
        return judged_step(self.record)

    def columns(self) -> tuple[memoryview, memoryview, memoryview]:
        """Its chunk indices, generation times and receipts: what its batch reads
        when first asked (:meth:`~rte.client.batch.ChunkBatch.of_record`)."""
        step = judged_step(self.record)
        return step.chunks, step.generated_ns, step.applied
