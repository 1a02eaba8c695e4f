"""A client slot's mailbox: the segment that one client and the daemon share, alone.

    page 0      segment header (shm.Segment)
    page 1      the client's words (when it last read its outbox, whether it is
                leaving), then its credit block (:class:`ClientBlock`)
    then        its two rings: inbox (client -> daemon), outbox (daemon -> client)

The daemon makes one per client slot at start (``DaemonNames.mailbox``, mode
0600) and opens its rings there and then, from its own layout: the geometry it
uses is its own, never what a header in the segment says later
(:class:`~shm.Ring` reads it once, at open). A client maps its own slot's
mailbox and no other (the control segment, read-only, tells it where
everything lies), so nothing a client writes, by bug or on purpose, can reach
another client's rings, credits or delivery times: the worst it can do is
garble its own, which the daemon reads as that client's errors.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rte.protocol import latency
from shm import Ring, Segment
from shm.segment import HEADER_SIZE, page_align

_LAST_POP, _LEAVING = 0, 8  # the client's words (bytes from page 1)
_WORDS = 128  # then the credit block

# credit block word indices
_STARVED, _GIVEN, _CLIENT_HISTOGRAM = 0, 1, 8
_CONSUMED = _CLIENT_HISTOGRAM + latency.BUCKETS


class ClientBlock:
    """One client slot's credit block, shared by the client and the daemon.

    - ``consumed[h]``: chunks of the session with handle ``h`` the client has
      released (written by the client only; the daemon compares it with what
      it emitted to know whether the session has credit left);
    - ``starved``: set by the daemon before it sleeps while this client's
      sessions have no credit; the client that releases a chunk clears it
      and rings the daemon's doorbell (so it rings only when the daemon waits
      for it, once);
    - ``given``: when the client last credited chunks (``time.monotonic_ns``),
      written with every give back; a daemon that waited for those credits
      learns when they came from it, not when it woke (see :meth:`given_ns`);
    - ``histogram``: pushed-to-taken delivery times (:mod:`rte.protocol.latency`).
    """

    def __init__(self, segment: Segment, offset: int, handles: int) -> None:
        raw = segment.bytes_at(offset, 8 * (_CONSUMED + handles))
        words = raw.cast("Q")  # the client's per-chunk view: plain words, no NumPy call
        self.starved = segment.atomic(offset + 8 * _STARVED)
        self.given = segment.atomic(offset + 8 * _GIVEN)
        self.histogram = latency.Histogram(words[_CLIENT_HISTOGRAM:_CONSUMED])
        self.tally = words[_CONSUMED:]  # the client adds to these
        self.consumed = np.frombuffer(raw, dtype=np.uint64)[_CONSUMED:]  # the daemon reads

    @staticmethod
    def size(handles: int) -> int:
        return 128 * -(-(8 * (_CONSUMED + handles)) // 128)

    def starve(self) -> None:
        """The daemon waits for this client (full barrier: then it re-checks credit)."""
        self.starved.cas(0, 1)

    def feed(self) -> bool:
        """Clear ``starved`` (full barrier after the consumed counts); True when it was set."""
        return self.starved.cas(1, 0)

    def credited(self) -> None:
        """The client credited chunks now (the reference path's stamp; the C give
        back writes it in the same call)."""
        self.given.store(time.monotonic_ns())

    def given_ns(self) -> int:
        """When the client last credited chunks (0: never)."""
        return int(self.given.load())

    def reset(self) -> None:
        """For a new client in this slot (the daemon's, before it is adopted)."""
        self.starved.store(0)
        self.given.store(0)


def _offsets(handles: int) -> tuple[int, int]:
    """Where the credit block and the inbox lie."""
    block = HEADER_SIZE + _WORDS
    return block, page_align(block + ClientBlock.size(handles))


class Mailbox:
    """One client slot's mailbox (its segment and rings); build with :meth:`create`
    (the daemon) or :meth:`open` (the client and inspectors)."""

    def __init__(
        self, segment: Segment, ring_capacity: int, handles: int, rings: tuple[Ring, Ring]
    ) -> None:
        self.segment = segment
        self.ring_capacity = ring_capacity
        self.inbox, self.outbox = rings
        at, _ = _offsets(handles)
        self.block = ClientBlock(segment, at, handles)
        self._credits = segment.bytes_at(at, ClientBlock.size(handles))
        self._last_pop = segment.atomic(HEADER_SIZE + _LAST_POP)
        self._leaving = segment.atomic(HEADER_SIZE + _LEAVING)

    @staticmethod
    def size(ring_capacity: int, handles: int) -> int:
        """The bytes of one mailbox segment, header included."""
        _, inbox = _offsets(handles)
        return inbox + 2 * Ring.footprint(ring_capacity)

    @classmethod
    def create(cls, segment: Segment, ring_capacity: int, handles: int) -> Mailbox:
        """Lay out a new mailbox in ``segment`` (the daemon, at start; its rings
        then keep the geometry they were made with)."""
        _, inbox = _offsets(handles)
        rings = (
            Ring.create(segment, inbox, ring_capacity, policy="spin"),
            Ring.create(
                segment, inbox + Ring.footprint(ring_capacity), ring_capacity, policy="spin"
            ),
        )
        return cls(segment, ring_capacity, handles, rings)

    @classmethod
    def open(
        cls,
        segment: Segment,
        ring_capacity: int,
        handles: int,
        *,
        fresh: bool = False,
        **outbox: Any,
    ) -> Mailbox:
        """The mailbox in ``segment``, laid out for ``ring_capacity`` and
        ``handles`` (the control segment says: the daemon's settings).
        ``inbox_bell`` rings the daemon; the rest (``doorbell``, ``policy``,
        ``spin_us``) is how the outbox is waited on. A ring whose header does not
        say ``ring_capacity`` is refused (LayoutError), unless ``fresh``: a claimer,
        whose slot it is alone until it activates, lays the whole mailbox out anew
        from those settings (:meth:`clear`), whatever a previous holder left there."""
        _, inbox = _offsets(handles)
        bell = outbox.pop("inbox_bell", None)
        at = (inbox, inbox + Ring.footprint(ring_capacity))
        if fresh:
            rings = (
                Ring.create(segment, at[0], ring_capacity, doorbell=bell, policy="spin"),
                Ring.create(segment, at[1], ring_capacity, **{"policy": "spin", **outbox}),
            )
        else:
            rings = (
                Ring(segment, at[0], doorbell=bell, policy="spin", expected=ring_capacity),
                Ring(segment, at[1], expected=ring_capacity, **{"policy": "spin", **outbox}),
            )
        mailbox = cls(segment, ring_capacity, handles, rings)
        if fresh:
            mailbox.clear(time.monotonic_ns())
        return mailbox

    # -- the client's words -------------------------------------------------

    def note_pop(self, now_ns: int) -> None:
        """The client read its outbox at ``now_ns`` (time.monotonic_ns; the idle limit)."""
        self._last_pop.store(now_ns)

    @property
    def last_pop_ns(self) -> int:
        return self._last_pop.load()

    def leave(self) -> None:
        """The client leaves without a BYE (its inbox is full, or it was revoked):
        the daemon reaps it at its next scan."""
        self._leaving.store(1)

    @property
    def leaving(self) -> bool:
        return bool(self._leaving.load())

    def clear(self, now_ns: int) -> None:
        """Lay the mailbox out anew for the slot's next client (rings wiped, words
        and credit block zeroed): by the daemon once it freed the slot, and by a
        claimer before it activates (the slot is its alone then; a previous holder
        may have written anything after it left)."""
        self.inbox.wipe()
        self.outbox.wipe()
        self._credits[:] = bytes(len(self._credits))
        self._leaving.store(0)
        self.note_pop(now_ns)
