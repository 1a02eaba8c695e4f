"""Outbound: where every outcome of the core loop goes, and how it gets there.

A chunk goes to its session's owner as one fixed record naming its slab slot
(published first; released at once if nobody can take it). A notice goes where
the :class:`~rte.ipc.router.Router` says, encoded to fit the ring it goes to.
Nothing here raises for one client's state: a client whose ring and backlog
are full loses the answer, which is counted, and is told how many once it
reads again. The daemon's counters in the control segment are kept here.
"""

from __future__ import annotations

from collections.abc import Iterable

from rte.contract import Manifest, Notice, NoticeKind, StepResult
from rte.ipc.allocator import SlabAllocator
from rte.ipc.clients import ClientTable, Connection
from rte.ipc.control import Control, Counter
from rte.ipc.router import Router
from rte.ipc.wire import ChunkEncoder, encode_notice
from rte.serve import OutboxItem
from shm import Slab

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
        manifest: Manifest,
    ) -> None:
        self.control = control
        self.slab = slab
        self.table = table
        self.router = router
        self.allocator = allocator
        self.encode_chunk = ChunkEncoder(manifest.latent_dtype, manifest.latent_shape)
        self._emitted = 0

    def deliver(self, items: Iterable[OutboxItem], requester: Connection | None) -> None:
        """Chunks to their owners; notices where the router says (``requester``:
        the client whose request produced them, if any)."""
        for item in items:
            if isinstance(item, StepResult):
                self.chunk(item)
                continue
            counter = _COUNTED.get(item.kind)
            if counter is not None:
                self.control.count(counter)
            everyone = self.table.connections.values()
            for connection in self.router.route(item, requester, everyone):
                self.send(connection, item)

    def chunk(self, result: StepResult) -> None:
        loan = self.allocator.take(result.session, result.chunk)
        loan.publish()
        owner = self.router.owner(result.session)
        timing = result.timing
        record = self.encode_chunk(
            result.session, result.chunk, loan.ref, timing.generated_ns, timing.emitted_ns
        )
        if owner is not None and owner.send(record):
            self._emitted += 1  # counted once per turn, not per chunk
            return
        self.slab.release(loan.ref)  # nobody will read it
        self.control.count(Counter.CHUNKS_DROPPED)

    def send(self, connection: Connection, notice: Notice) -> None:
        """An answer to one client; it never fails for its size (truncated to fit)."""
        if not connection.send(encode_notice(notice, connection.outbox.max_record)):
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
