"""The daemon's control segment: what the daemon tells its clients and inspectors.

    page 0          segment header (shm.Segment: magic, version, creator pid/start)
    page 1          daemon block: state, heartbeat, draining since, sessions held,
                    settings (clients, ring bytes, session handles per client), counters,
                    manifest (JSON), next tick time (paced),
                    delivery histogram (rte.protocol.latency)
    page 2          daemon block, continued: step-time histogram, both histograms' sums,
                    real time (capacity, pace, attached, reduced, cost model, ticks)
    page 3...       the roster: one 128-byte entry per client slot (rte.protocol.claims)

Written by the daemon alone: every client and inspector maps it read-only, so
no client can touch the daemon's state, counters or another client's entry.
What a client writes lies elsewhere: its claim in the claims segment (the one
segment every client maps writable, :mod:`rte.protocol.claims`), its rings and
credits in its own mailbox (:mod:`rte.protocol.mailbox`), mapped by it and the
daemon alone. The slab and the rest are their own segments (:mod:`rte.protocol.names`).

Every word that two processes share is read and written through the C atomics
(``shm.native``); the JSON manifest is written once before the state turns
READY (a release store), so a reader that saw READY reads it whole. Counters
live here so that a tool can read a live daemon without asking it anything.

A reader must not trust the settings before it has seen READY (the segment's
magic is published before the daemon has written them), so :attr:`Control.layout`
is read after an acquire of the state word and is checked against the mapping:
a control segment that claims more clients than it holds is refused, never
read past its end.
"""

from __future__ import annotations

import enum
import json
import struct
import time
from dataclasses import asdict, dataclass
from typing import Any

from rte.contract import Manifest
from rte.protocol import latency
from rte.protocol.claims import ENTRY, ClaimTable, Roster
from rte.protocol.mailbox import Mailbox
from shm import Segment, SegmentError
from shm.segment import HEADER_SIZE, PAGE, page_align
from shm.words import Word

KIND_CONTROL = 0x52544531  # "RTE1"
KIND_SLAB = 0x52544532  # "RTE2"
KIND_INPUTS = 0x52544533  # "RTE3"
KIND_FIGURES = 0x52544534  # "RTE4"
KIND_CLAIMS = 0x52544535  # "RTE5"
KIND_MAILBOX = 0x52544536  # "RTE6"
MAX_MANIFEST = 2048
MAX_CLIENTS = 1024
MAX_SESSIONS = 1 << 16


class DaemonState(enum.IntEnum):
    STARTING = 0
    READY = 1
    STOPPING = 2


class Counter(enum.IntEnum):
    """Daemon-wide counters (single writer: the serve thread)."""

    REQUESTS = 0
    CHUNKS = 1
    ADMISSION_REJECTIONS = 2
    ERRORS = 3
    IDLE_DETACHES = 4
    DEAD_CLIENTS_REAPED = 5
    CHUNKS_DROPPED = 6
    STEPS = 7
    LAST_ERROR_NS = 8
    FIRST_ERROR_NS = 9
    NOTICES_DROPPED = 10  # answers lost to a client whose ring and backlog were full
    CLIENTS_DISCONNECTED = 11  # clients revoked for not reading their answers
    # how the serve thread waited for requests and credit (shm.waiting.WaitTally):
    IDLE_WAITS = 12  # waits that found nothing to do at once
    IDLE_SLEEPS = 13  # ... that went on to sleep on the daemon's doorbell
    WAKEUPS = 14  # ... sleeps a client's post ended (a post and a wake-up paid)


# daemon block word offsets (bytes from the block start)
_STATE, _HEARTBEAT, _HEARTBEAT_NS, _NEXT_TICK = 0, 8, 16, 40
_DRAINING_NS, _HELD = 24, 32  # since when it drains (time_ns; 0: it does not), sessions held
_SETTINGS = 64  # max_clients, ring_capacity, handles
_COUNTERS = 128  # up to 48 counters, one word each
_MANIFEST = 512
_REASON, MAX_REASON = 2576, 236  # why the daemon stopped, when it failed (utf-8)
_HISTOGRAM = 2816  # emitted -> pushed, latency.BUCKETS words
# the daemon block's second page: step times (latency.BUCKETS words), then the sums
_STEP_HISTOGRAM = PAGE
_DELIVERY_SUM, _STEP_SUM = PAGE + 8 * latency.BUCKETS, PAGE + 8 * latency.BUCKETS + 8
_REALTIME = _STEP_SUM + 8  # RealTimeWord words, written by the serve thread


class RealTimeWord(enum.IntEnum):
    """The daemon's real-time words (:meth:`Control.realtime`), one u64 each.
    Zero in a segment of a daemon that wrote none: every one reads "unknown"."""

    CAPACITY = 0  # sessions its pace holds in real time, plus 1 (0: unpaced or not known)
    PACE_MHZ = 1  # its pace in millihertz (0: unpaced)
    ATTACHED = 2  # sessions attached
    REDUCED = 3  # sessions stepped at a reduced rate (overload)
    COST_A_NS = 4  # the turn's cost model t(n) = a + b*n: a, in ns
    COST_B_NS = 5  # ... and b, in ns per row
    TICKS_LATE = 6  # paced ticks begun more than half a period late
    TICKS_MISSED = 7  # paced ticks skipped: a turn ran past the next one
    ADMISSION = 8  # 1: by real time, 2: by rows (0: not written)
    MARGIN_PERMILLE = 9  # the share of the period kept free, in thousandths


@dataclass(frozen=True)
class Layout:
    """Where everything lies in the control segment, and how big the claims and
    each mailbox are, from the settings alone.

    ``handles``: the session handles of each client slot (the sessions one client
    may hold at once, parked ones included: ``--sessions-per-client``, by default
    the rows); its mailbox has a credit word for each, and a client sizes what it
    keeps by handle from it. The rows are the manifest's ``max_sessions``.
    """

    max_clients: int
    ring_capacity: int
    handles: int

    @property
    def block(self) -> int:
        return HEADER_SIZE

    @property
    def table(self) -> int:
        """The roster (after the daemon block)."""
        return HEADER_SIZE + 2 * PAGE

    @property
    def size(self) -> int:
        """The control segment's bytes."""
        return page_align(self.table + ENTRY * self.max_clients)

    @property
    def claims_size(self) -> int:
        return page_align(ClaimTable.size(self.max_clients))

    @property
    def mailbox_size(self) -> int:
        """One client slot's mailbox (:mod:`rte.protocol.mailbox`)."""
        return page_align(Mailbox.size(self.ring_capacity, self.handles))

    @property
    def shared_bytes(self) -> int:
        """The control segment, the claims and every mailbox, together."""
        return self.size + self.claims_size + self.max_clients * self.mailbox_size


def manifest_to_json(manifest: Manifest) -> bytes:
    return json.dumps(asdict(manifest)).encode()


def manifest_from_json(data: bytes) -> Manifest:
    raw = json.loads(data)
    raw["latent_shape"] = tuple(raw["latent_shape"])
    return Manifest(**raw)


class Control:
    """Typed access to a control segment (the daemon's, a client's or a tool's view).

    ``claims``: the claims segment, where a client (or the daemon) has it mapped;
    ``mailboxes``: the daemon's own, one per client slot (a client has none here).
    """

    def __init__(
        self,
        segment: Segment,
        claims: Segment | None = None,
        mailboxes: list[Mailbox] | None = None,
    ) -> None:
        self.segment = segment
        self.claims_segment = claims
        self.mailboxes = mailboxes or []
        self._words: dict[int, Word] = {}
        self._layout: Layout | None = None
        self._table: Roster | None = None
        self._claim_table: ClaimTable | None = None

    @property
    def layout(self) -> Layout:
        """Where the client table and rings lie; SegmentError if the settings
        are not written yet (the daemon is STARTING) or do not fit the segment."""
        if self._layout is None:
            state = self.state  # acquire: pairs with the release of READY in set_state
            if state is DaemonState.STARTING:
                raise SegmentError(f"{self.segment.name}: the daemon is still starting")
            max_clients, capacity, handles = (
                self._word(_SETTINGS + 8 * i).load() for i in range(3)
            )
            if not (
                1 <= max_clients <= MAX_CLIENTS and capacity >= 64 and 1 <= handles <= MAX_SESSIONS
            ):
                raise SegmentError(
                    f"{self.segment.name}: corrupt settings ({max_clients} clients, "
                    f"{handles} session handles each)"
                )
            layout = Layout(max_clients, capacity, handles)
            if layout.size > self.segment.size:
                raise SegmentError(
                    f"{self.segment.name}: its settings ({max_clients} clients, rings of "
                    f"{capacity} B) need {layout.size:,} bytes but it has {self.segment.size:,}"
                )
            self._layout = layout
        return self._layout

    @property
    def table(self) -> Roster:
        """The daemon's roster of client slots (see :mod:`rte.protocol.claims`)."""
        if self._table is None:
            layout = self.layout
            self._table = Roster(self.segment, layout.table, layout.max_clients)
        return self._table

    @property
    def claim_table(self) -> ClaimTable:
        """The claims (see :mod:`rte.protocol.claims`); SegmentError where not mapped."""
        if self._claim_table is None:
            if self.claims_segment is None:
                raise SegmentError(f"{self.segment.name}: the claims are not mapped here")
            self._claim_table = ClaimTable(self.claims_segment, self.layout.max_clients)
        return self._claim_table

    @classmethod
    def initialise(
        cls,
        segment: Segment,
        layout: Layout,
        manifest: Manifest,
        claims: Segment | None = None,
        mailboxes: list[Mailbox] | None = None,
    ) -> Control:
        """Write the daemon block of a new segment (state STARTING); the
        settings and manifest become visible to readers with READY."""
        block = segment.bytes_at(layout.block, PAGE)
        raw = manifest_to_json(manifest)
        if len(raw) > MAX_MANIFEST:
            raise ValueError(f"manifest of {len(raw)} bytes does not fit in {MAX_MANIFEST}")
        struct.pack_into(
            "<QQQ", block, _SETTINGS, layout.max_clients, layout.ring_capacity, layout.handles
        )
        struct.pack_into("<I", block, _MANIFEST, len(raw))
        block[_MANIFEST + 4 : _MANIFEST + 4 + len(raw)] = raw
        control = cls(segment, claims, mailboxes)
        control._layout = layout
        return control

    def _word(self, offset: int) -> Word:
        word = self._words.get(offset)
        if word is None:  # pointers are made once: beats and counts are per turn
            word = self._words[offset] = self.segment.atomic(HEADER_SIZE + offset)
        return word

    # -- daemon block -----------------------------------------------------

    @property
    def state(self) -> DaemonState:
        return DaemonState(self._word(_STATE).load())

    def set_state(self, state: DaemonState) -> None:
        # release: the manifest and settings are visible before READY; pairs
        # with the acquire in ``state``
        self._word(_STATE).store(int(state))

    def beat(self) -> None:
        self._word(_HEARTBEAT).store(self.heartbeat + 1)
        self._word(_HEARTBEAT_NS).store(time.time_ns())

    @property
    def heartbeat(self) -> int:
        return self._word(_HEARTBEAT).load()

    @property
    def heartbeat_age_s(self) -> float:
        return (time.time_ns() - self._word(_HEARTBEAT_NS).load()) / 1e9

    @property
    def draining_since_ns(self) -> int:
        """When the daemon began draining (``time.time_ns``); 0 while it is not
        (:mod:`rte.protocol.drain`)."""
        return self._word(_DRAINING_NS).load()

    def set_draining(self, since_ns: int) -> None:
        self._word(_DRAINING_NS).store(since_ns)

    @property
    def held(self) -> int:
        """Sessions the daemon holds: attached, parked, being detached or (draining)
        out on a move that may bring them back (written by the serve thread every
        scan, and at once while draining)."""
        return self._word(_HELD).load()

    def set_held(self, sessions: int) -> None:
        self._word(_HELD).store(sessions)

    @property
    def claims(self) -> int:
        """Client slots ever activated: a daemon that sees it change adopts at once."""
        return self.claim_table.claims

    @property
    def histogram(self) -> latency.Histogram:
        """The daemon's emitted-to-pushed delivery times (and their sum)."""
        return self._histogram(_HISTOGRAM, _DELIVERY_SUM)

    @property
    def step_histogram(self) -> latency.Histogram:
        """How long the daemon's steps took (and their sum)."""
        return self._histogram(_STEP_HISTOGRAM, _STEP_SUM)

    def _histogram(self, at: int, total: int) -> latency.Histogram:
        raw = self.segment.bytes_at(self.layout.block + at, 8 * latency.BUCKETS)
        word = self.segment.bytes_at(self.layout.block + total, 8)
        return latency.Histogram(raw.cast("Q"), word.cast("Q"))

    @property
    def next_tick_ns(self) -> int:
        """When a paced daemon's next step begins (time.monotonic_ns); 0 when not paced."""
        return self._word(_NEXT_TICK).load()

    def set_next_tick(self, ns: int) -> None:
        self._word(_NEXT_TICK).store(ns)

    def publish_realtime(self, values: dict[RealTimeWord, int]) -> None:
        """Write real-time words (the serve thread; release stores, each word whole)."""
        for word, value in values.items():
            self._word(_REALTIME + 8 * word).store(max(0, int(value)))

    def realtime(self) -> dict[str, Any]:
        """The real-time words as figures: ``capacity`` (None: not known or unpaced),
        ``pace_hz``, ``attached``, ``reduced``, ``cost_a_s``, ``cost_b_s``,
        ``ticks_late``, ``ticks_missed``, ``admission``, ``margin``."""
        raw = {w: self._word(_REALTIME + 8 * w).load() for w in RealTimeWord}
        return {
            "capacity": raw[RealTimeWord.CAPACITY] - 1 if raw[RealTimeWord.CAPACITY] else None,
            "pace_hz": raw[RealTimeWord.PACE_MHZ] / 1000,
            "attached": raw[RealTimeWord.ATTACHED],
            "reduced": raw[RealTimeWord.REDUCED],
            "cost_a_s": raw[RealTimeWord.COST_A_NS] / 1e9,
            "cost_b_s": raw[RealTimeWord.COST_B_NS] / 1e9,
            "ticks_late": raw[RealTimeWord.TICKS_LATE],
            "ticks_missed": raw[RealTimeWord.TICKS_MISSED],
            "admission": {1: "realtime", 2: "rows"}.get(raw[RealTimeWord.ADMISSION]),
            "margin": raw[RealTimeWord.MARGIN_PERMILLE] / 1000,
        }

    def count(self, counter: Counter, n: int = 1) -> None:
        self._word(_COUNTERS + 8 * counter).add(n)
        if counter is Counter.ERRORS:
            now = time.time_ns()
            self._word(_COUNTERS + 8 * Counter.LAST_ERROR_NS).store(now)
            self._word(_COUNTERS + 8 * Counter.FIRST_ERROR_NS).cas(0, now)

    def counters(self) -> dict[str, int]:
        return {c.name.lower(): self._word(_COUNTERS + 8 * c).load() for c in Counter}

    def set_reason(self, text: str) -> None:
        """Say why the daemon is stopping (before STOPPING is stored; clients read it
        after seeing STOPPING). Cut to fit."""
        raw = text.encode()[:MAX_REASON].decode(errors="ignore").encode()
        block = self.segment.bytes_at(self.layout.block, PAGE)
        block[_REASON + 4 : _REASON + 4 + len(raw)] = raw
        struct.pack_into("<I", block, _REASON, len(raw))

    @property
    def reason(self) -> str:
        """Why the daemon stopped, if it failed ("" when it stopped as asked)."""
        block = self.segment.bytes_at(self.layout.block, PAGE)
        (length,) = struct.unpack_from("<I", block, _REASON)
        return bytes(block[_REASON + 4 : _REASON + 4 + min(length, MAX_REASON)]).decode()

    def manifest(self) -> Manifest:
        block = self.segment.bytes_at(self.layout.block, PAGE)
        (length,) = struct.unpack_from("<I", block, _MANIFEST)
        if length > MAX_MANIFEST:
            raise ValueError(f"{self.segment.name}: manifest length {length} is corrupt")
        return manifest_from_json(bytes(block[_MANIFEST + 4 : _MANIFEST + 4 + length]))
