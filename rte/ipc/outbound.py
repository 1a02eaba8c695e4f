"""Outbound: where every outcome of the core loop goes, and how it gets there.

A step's chunks arrive as the leases that hold them
(:class:`~rte.ipc.allocator.Lease`: the slots, whether they are one run, the
sessions and chunk indices of their rows, when they were generated and
emitted), in place of the chunks in what the serve loop returned; each owner
gets one STEP record written from its leases alone (published first, in one
call; released at once if nobody can take them), and the owner's sessions
are charged what they were sent against their credits. A notice goes where
the :class:`~rte.ipc.router.Router` says, encoded to fit the ring it goes to
(an ATTACHED one carries the session's handle). Each STEP record carries
every row's receipt (the seq of the last action its chunk applied, from the
serve loop's :class:`~rte.receipts.Receipts`; none while no session has
acted).
The usual step out (one lease, nothing queued before it) is one C call
(:func:`~rte.protocol.steps.step_writer`): published, pushed in place, its
delivery time and emitted counts added; the reference path (several leases, a
backlog, ``RTE_PURE_PYTHON=1``) publishes, then encodes or pushes.
Nothing here raises for one client's state: a client whose ring and backlog
are full loses the answer, which is counted, and is told how many once it
reads again. The daemon's counters in the control segment are kept here.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
from typing import Any

import numpy as np

from rte.contract import Notice, NoticeKind
from rte.ipc.allocator import Lease
from rte.ipc.clients import ClientTable, Connection
from rte.ipc.router import Router
from rte.protocol.control import Control, Counter
from rte.protocol.steps import IN_PLACE, send_step, step_head, step_writer
from rte.protocol.wire import encode_notice
from rte.receipts import Receipts
from rte.serve import OutboxItem
from shm import ShmError, Slab, one_run
from shm.batch import Words, release_slots
from shm.steps import RowsWriter

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
    ) -> None:
        self.control = control
        self.slab = slab
        self.table = table
        self.router = router
        self.histogram = control.histogram
        self.receipts: Receipts | None = None  # the serve loop's, set by the core
        self._emitted = 0
        # each client slot's writer of STEP records, with the connection it is for
        self._writers: dict[int, tuple[Connection, RowsWriter]] = {}

    def deliver(
        self, items: list[OutboxItem], requester: Connection | None, credits: int = 0
    ) -> None:
        """Chunks (their leases) to their owners, a STEP record each; notices where
        the router says (``requester``: the client whose request produced them,
        if any, and ``credits`` what that request asked for)."""
        if len(items) == 1 and type(items[0]) is Lease:  # a step of one client: the usual
            self._step(items)  # type: ignore[arg-type]
            return
        leases = [item for item in items if type(item) is Lease]
        if leases:  # every chunk of this call, before the notices after it
            self.steps(leases)
        if len(leases) == len(items):  # a step without errors: chunks only
            return
        for item in items:
            if type(item) is Lease:
                continue
            assert isinstance(item, Notice)
            counter = _COUNTED.get(item.kind)
            if counter is not None:
                self.control.count(counter)
            everyone = self.table.connections.values()
            for connection in self.router.route(item, requester, everyone, credits):
                self.send(connection, item)

    def steps(self, leases: list[Lease]) -> None:
        """One STEP record per owner of ``leases`` (a step that decoded several
        batches, just after a join, has several leases each)."""
        if len(leases) > 1:
            by_owner: dict[int, list[Lease]] = {}
            for lease in leases:
                by_owner.setdefault(lease.owner.index, []).append(lease)
            for group in by_owner.values():
                self._step(group)
        elif leases:
            self._step(leases)

    def _step(self, leases: list[Lease]) -> None:
        owner = leases[0].owner
        live = self.table.connections.get(owner.index) is owner
        if live and len(leases) == 1 and IN_PLACE and not owner.backlog:
            (lease,) = leases
            found = self._handles(owner, lease.sessions)
            if found is not None:
                pushed = self._send_whole(owner, lease, *found)
                if pushed:  # sent, or its slots reclaimed meanwhile (counted)
                    return
                # published, not pushed (no room): the reference queues the record
                self._send(owner, leases, live)
                return
        published: list[Lease] = []
        for lease in leases:
            try:
                lease.loan.publish()
                published.append(lease)
            except ShmError:  # reclaimed meanwhile: its client is gone, nothing to send
                self.control.count(Counter.CHUNKS_DROPPED, len(lease.loan))
        if published:
            self._send(owner, published, live)

    def _handles(
        self, owner: Connection, sessions: list[str]
    ) -> tuple[array.array[int], np.ndarray[Any, Any]] | None:
        """The handles of ``sessions`` (as the ``uint32`` column the C reads in
        place, and as an index), or None when one detached meanwhile (nobody
        reads its chunk). The engine hands the same list step after step: the
        last one's are kept."""
        cached = owner.handle_cache
        if cached is not None and cached[0] is sessions:
            return cached[1], cached[2]
        try:
            handles = array.array("I", map(owner.handles.__getitem__, sessions))
        except KeyError:
            return None
        index = np.array(handles, np.intp)
        owner.handle_cache = (sessions, handles, index)
        return handles, index

    def _send_whole(
        self,
        owner: Connection,
        lease: Lease,
        handles: array.array[int],
        index: np.ndarray[Any, Any],
    ) -> int:
        """One lease out in one C call (:func:`~rte.protocol.steps.step_writer`):
        published, its STEP record pushed in place, the delivery histogram and the
        owner's emitted counts added to. Returns the push stamp; 0 when the slots
        were published but the record not pushed; -1 when some slot was reclaimed
        meanwhile (its client is gone: counted, nothing sent)."""
        writer = self._writers.get(owner.index)
        figures = owner.figures
        if writer is None or writer[0] is not owner:
            counted = figures.counted() if figures is not None else None
            writer = self._writers[owner.index] = (
                owner,
                step_writer(owner.outbox, self.slab, self.histogram, self.control.segment, counted),
            )
        loan, emitted_ns = lease.loan, lease.emitted_ns
        receipts = self.receipts
        applied = receipts.column(lease.sessions, lease.chunks) if receipts is not None else None
        pushed = writer[1].send(
            step_head(len(loan), loan.contiguous, emitted_ns),
            loan.slots,
            loan.generations,
            lease.chunks if lease.chunk_words is None else lease.chunk_words,  # (in place)
            lease.generated_ns,
            handles,
            applied,
            emitted_ns,
            owner.emitted,
        )
        loan.mark_published()
        if pushed > 0:  # (its figures counted by the C)
            self._emitted += len(loan)
        elif pushed < 0:
            self.control.count(Counter.CHUNKS_DROPPED, len(loan))
        return pushed

    def _send(self, owner: Connection, published: list[Lease], live: bool) -> None:
        """The reference: one STEP record of ``published`` (their slots published)
        encoded in Python (or pushed in place, from 16 rows) and sent or queued."""
        record = _Record.of(published)
        slots, sessions, emitted_ns = record.slots, record.sessions, record.emitted_ns
        found = self._handles(owner, sessions) if live else None
        if found is not None:
            handles, index = found
            receipts = self.receipts
            applied = receipts.column(sessions, record.chunks) if receipts is not None else None
            pushed = send_step(
                owner.outbox,
                owner.send,
                bool(owner.backlog),
                slots,
                record.generations,
                record.chunks,
                record.generated_ns,
                handles,
                contiguous=record.contiguous,
                emitted_ns=emitted_ns,
                applied=applied,
            )
            if pushed:
                self.histogram.add(pushed - emitted_ns)
                owner.emitted[index] += 1
                self._emitted += len(slots)
                figures = owner.figures
                if figures is not None and IN_PLACE:  # counted in C, as the writer does
                    figures.count(handles, emitted_ns, _words(applied))
                elif figures is not None:  # the reference's NumPy, kept and counted together
                    figures.emitted(index, emitted_ns, applied)
                return
        # nobody will read them: give them back as their reader would
        with contextlib.suppress(ShmError):
            release_slots(self.slab, owner.index, slots, record.generations)
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


@dataclasses.dataclass(slots=True)  # (not frozen: its __init__ then cost 1.4 us, not 0.3)
class _Record:
    """One owner's leases of one step as one STEP record's columns (made once a step,
    never changed)."""

    slots: Words
    generations: Words
    sessions: list[str]
    chunks: list[int]
    generated_ns: Any  # one time for every row, or one per row
    emitted_ns: int
    contiguous: bool

    @classmethod
    def of(cls, leases: list[Lease]) -> _Record:
        """The columns of ``leases`` (one lease: as it is, its run as it was leased)."""
        if len(leases) == 1:
            (lease,) = leases
            loan = lease.loan
            return cls(
                loan.slots,
                loan.generations,
                lease.sessions,
                lease.chunks,
                lease.generated_ns,
                lease.emitted_ns,
                loan.contiguous,
            )
        slots = np.concatenate([lease.loan.slots for lease in leases])
        return cls(
            slots,
            np.concatenate([lease.loan.generations for lease in leases]),
            [s for lease in leases for s in lease.sessions],
            [c for lease in leases for c in lease.chunks],
            [lease.generated_ns for lease in leases for _ in lease.sessions],
            min(lease.emitted_ns for lease in leases),
            # runs leased one after another may join into one: the one test of a run
            all(lease.loan.contiguous for lease in leases) and one_run(slots),
        )


def _words(applied: list[int] | None) -> array.array[int] | None:
    """Receipts as the ``uint32`` column the C counts (None: no session has acted)."""
    return None if applied is None else array.array("I", applied)
