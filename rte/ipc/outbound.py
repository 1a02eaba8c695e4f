"""Outbound: where every outcome of the core loop goes, and how it gets there.

A step's chunks go to each owner as one STEP record naming their slab slots
(published first, in one call; released at once if nobody can take them), and
the owner's sessions are charged what they were sent against their credits. A
notice goes where the :class:`~rte.ipc.router.Router` says, encoded to fit the
ring it goes to (an ATTACHED one carries the session's handle). Each STEP
record carries every row's receipt (the seq of the last action its chunk
applied, from the serve loop's :class:`~rte.receipts.Receipts`; none while no
session has acted).
Nothing here raises for one client's state: a client whose ring and backlog
are full loses the answer, which is counted, and is told how many once it
reads again. The daemon's counters in the control segment are kept here.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np

from rte.contract import Notice, NoticeKind, StepResult
from rte.ipc.allocator import Lease, SlabAllocator
from rte.ipc.clients import ClientTable, Connection
from rte.ipc.router import Router
from rte.protocol.control import Control, Counter
from rte.protocol.wire import encode_notice, encode_step, stamp_pushed
from rte.receipts import Receipts
from rte.serve import OutboxItem
from shm import ShmError, Slab
from shm.batch import Words, release_slots

_COUNTED = {
    NoticeKind.ERROR: Counter.ERRORS,
    NoticeKind.DROPPED: Counter.CHUNKS_DROPPED,
    NoticeKind.REJECTED: Counter.ADMISSION_REJECTIONS,
}


class Outbound:
    """Delivers the core loop's outcomes to the clients of one daemon."""

    def __init__(
        self,
        control: Control,
        slab: Slab,
        table: ClientTable,
        router: Router,
        allocator: SlabAllocator,
    ) -> None:
        self.control = control
        self.slab = slab
        self.table = table
        self.router = router
        self.allocator = allocator
        self.histogram = control.histogram
        self.receipts: Receipts | None = None  # the serve loop's, set by the core
        self._emitted = 0

    def deliver(
        self, items: list[OutboxItem], requester: Connection | None, credits: int = 0
    ) -> None:
        """Chunks to their owners, a STEP record each; notices where the router
        says (``requester``: the client whose request produced them, if any, and
        ``credits`` what that request asked for)."""
        if items and type(items[-1]) is StepResult:  # a step without errors: chunks only
            self.steps(items[0].timing.emitted_ns)  # type: ignore[union-attr]
            return
        stepped = False
        for item in items:
            if type(item) is StepResult:
                if not stepped:  # every chunk of this call, before the notices after it
                    stepped = True
                    self.steps(item.timing.emitted_ns)
                continue
            assert isinstance(item, Notice)
            counter = _COUNTED.get(item.kind)
            if counter is not None:
                self.control.count(counter)
            everyone = self.table.connections.values()
            for connection in self.router.route(item, requester, everyone, credits):
                self.send(connection, item)
        if not stepped:
            self.steps(time.monotonic_ns())  # nothing leased is left unsent

    def steps(self, emitted_ns: int) -> None:
        """The chunks leased since the last call: one STEP record per owner (a step
        that decoded several batches, just after a join, has several leases each)."""
        leases = self.allocator.take()
        if len(leases) > 1:
            by_owner: dict[int, list[Lease]] = {}
            for lease in leases:
                by_owner.setdefault(lease.owner.index, []).append(lease)
            for group in by_owner.values():
                self._step(group, emitted_ns)
        elif leases:
            self._step(leases, emitted_ns)

    def _step(self, leases: list[Lease], emitted_ns: int) -> None:
        owner = leases[0].owner
        published: list[Lease] = []
        for lease in leases:
            try:
                lease.loan.publish()
                published.append(lease)
            except ShmError:  # reclaimed meanwhile: its client is gone, nothing to send
                self.control.count(Counter.CHUNKS_DROPPED, len(lease.loan))
        if not published:
            return
        slots, generations, sessions, chunks, generated, contiguous = _columns(published)
        live = self.table.connections.get(owner.index) is owner
        handles: list[int] | None = None
        cached = owner.handle_cache  # the engine hands the same list step after step
        if cached is not None and cached[0] is sessions:
            handles, index = cached[1], cached[2]
        elif live:
            with contextlib.suppress(KeyError):  # a session detached meanwhile: nobody reads
                handles = list(map(owner.handles.__getitem__, sessions))
                index = np.array(handles, np.intp)
                owner.handle_cache = (sessions, handles, index)
        if handles is not None and live:
            receipts = self.receipts
            applied = receipts.column(sessions, chunks) if receipts is not None else None
            record = encode_step(
                slots,
                generations,
                chunks,
                generated,
                handles,
                contiguous=contiguous,
                emitted_ns=emitted_ns,
                applied=applied,
            )
            pushed = time.monotonic_ns()
            stamp_pushed(record, pushed)
            if owner.send(record):
                self.histogram.add(pushed - emitted_ns)
                owner.emitted[index] += 1
                self._emitted += len(slots)
                if owner.figures is not None:
                    owner.figures.emitted(index, emitted_ns, applied)
                return
        # nobody will read them: give them back as their reader would
        with contextlib.suppress(ShmError):
            release_slots(self.slab, owner.index, slots, generations)
        self.control.count(Counter.CHUNKS_DROPPED, len(slots))

    def send(self, connection: Connection, notice: Notice) -> None:
        """An answer to one client; it never fails for its size (truncated to fit)."""
        handle = connection.handles.get(notice.session, 0)
        if notice.kind is NoticeKind.REDUCED and connection.figures is not None:
            connection.figures.reduced(handle)
        record = encode_notice(notice, connection.outbox.max_record, handle)
        if not connection.send(record):
            self.control.count(Counter.NOTICES_DROPPED)

    def tell_dropped(self, connection: Connection) -> None:
        n, connection.dropped = connection.dropped, 0
        text = (
            f"{n} answers to this client were dropped: it sent requests faster than it read "
            "their answers; read them (poll, notices) or it will be disconnected"
        )
        self.send(connection, Notice("", NoticeKind.ERROR, text))

    def count_chunks(self) -> None:
        """Add the chunks delivered since the last call to the daemon's counter."""
        if self._emitted:
            self.control.count(Counter.CHUNKS, self._emitted)
            self._emitted = 0


def _columns(
    leases: list[Lease],
) -> tuple[Words, Words, list[str], list[int], Any, bool]:
    """One owner's leases of one step as one record's columns (one lease: as it is)."""
    if len(leases) == 1:
        (lease,) = leases
        loan = lease.loan
        return (
            loan.slots,
            loan.generations,
            lease.sessions,
            lease.chunks,
            lease.generated_ns,
            loan.contiguous,
        )
    slots = np.concatenate([lease.loan.slots for lease in leases])
    generations = np.concatenate([lease.loan.generations for lease in leases])
    sessions = [s for lease in leases for s in lease.sessions]
    chunks = [c for lease in leases for c in lease.chunks]
    generated = [lease.generated_ns for lease in leases for _ in lease.sessions]
    contiguous = bool(np.all(np.diff(slots.astype(np.int64)) == 1))
    return slots, generations, sessions, chunks, generated, contiguous
