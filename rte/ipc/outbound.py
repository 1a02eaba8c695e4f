"""Outbound: where every outcome of the core loop goes, and how it gets there.

A step's chunks go to each owner as one STEP record naming their slab slots
(published first, in one call; released at once if nobody can take them), and
the owner's sessions are charged what they were sent against their credits. A
notice goes where the :class:`~rte.ipc.router.Router` says, encoded to fit the
ring it goes to (an ATTACHED one carries the session's handle).
Nothing here raises for one client's state: a client whose ring and backlog
are full loses the answer, which is counted, and is told how many once it
reads again. The daemon's counters in the control segment are kept here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable

from rte.contract import Notice, NoticeKind, StepResult
from rte.ipc.allocator import Lease, SlabAllocator
from rte.ipc.clients import ClientTable, Connection
from rte.ipc.control import Control, Counter
from rte.ipc.router import Router
from rte.ipc.wire import encode_notice, encode_step
from rte.serve import OutboxItem
from shm import ShmError, Slab
from shm.batch import release_slots

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
        self._emitted = 0

    def deliver(
        self, items: Iterable[OutboxItem], requester: Connection | None, credits: int = 0
    ) -> None:
        """Chunks to their owners, a STEP record each; notices where the router
        says (``requester``: the client whose request produced them, if any, and
        ``credits`` what that request asked for)."""
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
        """The chunks leased since the last call: one STEP record per owner."""
        leases = self.allocator.take()
        if not leases:
            return
        pushed = time.monotonic_ns()
        for lease in leases:
            self._step(lease, emitted_ns, pushed)
        self.histogram.add(pushed - emitted_ns)

    def _step(self, lease: Lease, emitted_ns: int, pushed_ns: int) -> None:
        owner, loan = lease.owner, lease.loan
        try:
            loan.publish()
        except ShmError:  # reclaimed meanwhile: its client is gone, nothing to send
            self.control.count(Counter.CHUNKS_DROPPED, len(loan))
            return
        live = self.table.connections.get(owner.index) is owner
        handles = [owner.handles.get(s, -1) for s in lease.sessions] if live else [-1]
        if min(handles) >= 0:
            record = encode_step(
                loan.slots,
                loan.generations,
                lease.chunks,
                lease.generated_ns,
                handles,
                contiguous=loan.contiguous,
                emitted_ns=emitted_ns,
                pushed_ns=pushed_ns,
            )
            if owner.send(record):
                owner.emitted[handles] += 1
                self._emitted += len(loan)
                return
        # nobody will read them: give them back as their reader would
        with contextlib.suppress(ShmError):
            release_slots(self.slab, loan.owner, loan.slots, loan.generations)
        self.control.count(Counter.CHUNKS_DROPPED, len(loan))

    def send(self, connection: Connection, notice: Notice) -> None:
        """An answer to one client; it never fails for its size (truncated to fit)."""
        handle = connection.handles.get(notice.session, 0)
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
