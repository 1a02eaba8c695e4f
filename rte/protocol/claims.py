"""Who holds which client slot: the claims clients make, and the daemon's roster.

Two tables, one entry (128 bytes, its own cache lines) per client slot:

- the **claims** (:class:`ClaimTable`), in a segment of their own
  (``DaemonNames.claims``), the one thing every client maps writable: a claimer
  takes a free slot there by compare-and-swap, writes its pid and start time,
  and activates it;
- the **roster** (:class:`Roster`), in the control segment, written by the
  daemon alone and read-only for every client: whom it adopted into each slot
  (generation, pid, start, how it wakes), its session count, and whether the
  slot is ACTIVE, CLOSING or REVOKED.

A claim's first word is ``generation << 8 | state``, so every change of hands
is one compare-and-swap that names the generation it expects: a claim bumps the
generation, and a stale actor (a claimer the daemon gave up on) fails its swap
instead of taking a slot someone else now holds.

    claims:  FREE --claim--> CLAIMED --activate--> ACTIVE --(the daemon frees it)--> FREE
                                |--abandon--> FREE
    roster:  FREE --adopt--> ACTIVE --(BYE, leaving, death)--> CLOSING --> FREE
                                |--(revoked by the daemon)--> REVOKED --(leaves, dies)--> FREE

The daemon reads a claim only for a slot its roster has FREE; a slot it holds
is judged by its own record and that client's mailbox alone (BYE, the leaving
word, the process table). So a client that writes garbage over the claims can
delay claims, never disturb a client the daemon serves; and a claimer takes a
slot only when the roster, which no client can write, says it is free.
"""

from __future__ import annotations

import enum
import struct
import time
from dataclasses import dataclass

from shm import Segment
from shm.segment import HEADER_SIZE
from shm.words import Word

ENTRY = 128  # bytes per client slot (its own cache lines)
_START = struct.Struct("<d")


class ClientState(enum.IntEnum):
    FREE = 0
    CLAIMED = 1  # a client took the slot and is setting it up; the daemon ignores it
    ACTIVE = 2  # the daemon serves it
    CLOSING = 3  # said BYE (or could not), or found dead: the daemon is reclaiming it
    REVOKED = 4  # disconnected by the daemon while alive: FREE once it leaves or dies


class _Field(enum.IntEnum):
    """The words of one entry (a claim's, or the roster's)."""

    STATE = 0  # generation << 8 | ClientState
    PID = 1
    START = 2  # the process's start time, float64 bits (pid + start name one process)
    WAKE = 3  # how the daemon wakes the client: 0 its semaphore, 1 its FIFO (an event loop)
    SINCE_NS = 4  # a claim's: time.monotonic_ns() when it was made (the grace period)
    SESSIONS = 5  # the roster's: the slot's session count (for inspectors)


def _word(generation: int, state: ClientState) -> int:
    return generation << 8 | state


def _float_bits(value: float) -> int:
    return int.from_bytes(_START.pack(value), "little")


@dataclass(frozen=True)
class ClientEntry:
    """A snapshot of one entry (fields read after its state word)."""

    index: int
    state: ClientState
    generation: int
    pid: int
    start: float
    sessions: int = 0  # the roster's; a claim's is 0
    wakes_by_fd: bool = False  # woken through its FIFO (an asyncio client), not its semaphore
    since_ns: int = 0  # a claim's: when it was made (time.monotonic_ns)


class _Entries:
    """``max_clients`` entries at ``offset`` of ``segment``."""

    def __init__(self, segment: Segment, offset: int, max_clients: int) -> None:
        self.segment = segment
        self.offset = offset
        self.max_clients = max_clients
        self._words: dict[tuple[int, _Field], Word] = {}

    def _at(self, index: int, field: _Field) -> Word:
        word = self._words.get((index, field))
        if word is None:
            if not 0 <= index < self.max_clients:
                raise IndexError(f"client slot {index} (0..{self.max_clients - 1})")
            offset = self.offset + ENTRY * index + 8 * field
            word = self._words[(index, field)] = self.segment.atomic(offset)
        return word

    def _load(self, index: int) -> tuple[int, ClientState | None]:
        """The generation and state (None: garbage, which no writer of ours stores)."""
        word = self._at(index, _Field.STATE).load()
        try:
            return word >> 8, ClientState(word & 0xFF)
        except ValueError:
            return word >> 8, None

    def _store(self, index: int, field: _Field, value: int) -> None:
        self._at(index, field).store(value)

    def _relaxed(self, index: int, field: _Field) -> int:
        return self._at(index, field).load_relaxed()

    def entry(self, index: int) -> ClientEntry:
        generation, state = self._load(index)  # acquire first: the fields are published
        start_bits = self._relaxed(index, _Field.START)
        return ClientEntry(
            index,
            ClientState.CLOSING if state is None else state,
            generation,
            self._relaxed(index, _Field.PID),
            _START.unpack(start_bits.to_bytes(8, "little"))[0],
            self._relaxed(index, _Field.SESSIONS),
            bool(self._relaxed(index, _Field.WAKE)),
            self._relaxed(index, _Field.SINCE_NS),
        )

    def entries(self) -> list[ClientEntry]:
        return [self.entry(i) for i in range(self.max_clients)]

    def state(self, index: int) -> ClientState:
        """One slot's state alone (one atomic load: cheap enough for every call)."""
        state = self._load(index)[1]
        return ClientState.CLOSING if state is None else state


class Roster(_Entries):
    """The daemon's record of its client slots, in the control segment (written by
    the daemon alone; every client maps it read-only)."""

    def generation(self, index: int) -> int:
        return self._load(index)[0]

    def adopt(self, claim: ClientEntry) -> None:
        """Slot ``claim.index`` is served, for the claimer ``claim`` names (its fields
        first, then the state: a release that publishes them)."""
        i = claim.index
        self._store(i, _Field.PID, claim.pid)
        self._store(i, _Field.START, _float_bits(claim.start))
        self._store(i, _Field.WAKE, int(claim.wakes_by_fd))
        self._store(i, _Field.SESSIONS, 0)
        self._store(i, _Field.STATE, _word(claim.generation, ClientState.ACTIVE))

    def set_state(self, index: int, state: ClientState) -> None:
        """ACTIVE -> CLOSING -> FREE or REVOKED; the generation stays."""
        self._store(index, _Field.STATE, _word(self._load(index)[0], state))

    def set_sessions(self, index: int, sessions: int) -> None:
        self._store(index, _Field.SESSIONS, sessions)


class ClaimTable(_Entries):
    """The claims of ``max_clients`` slots, in the claims segment ``segment``, with
    the word a client bumps when it activates (the daemon adopts at once)."""

    def __init__(self, segment: Segment, max_clients: int) -> None:
        super().__init__(segment, HEADER_SIZE + ENTRY, max_clients)
        self._claims = segment.atomic(HEADER_SIZE)

    @staticmethod
    def size(max_clients: int) -> int:
        """The bytes of a claims segment, header included."""
        return HEADER_SIZE + ENTRY * (1 + max_clients)

    @property
    def claims(self) -> int:
        """Slots ever activated: a daemon that sees it change adopts at once."""
        return self._claims.load()

    def _swap(self, index: int, expected: int, desired: int) -> bool:
        return self._at(index, _Field.STATE).cas(expected, desired)

    # -- a client's moves -------------------------------------------------

    def claim(
        self, pid: int, start: float, roster: Roster, *, wakes_by_fd: bool = False
    ) -> tuple[int, int] | None:
        """Take a free slot for this process: (index, generation), None when all are taken.

        A slot is free when its claim is FREE and ``roster`` (the daemon's, which no
        client writes) says so too. It is the claimer's alone until :meth:`activate`:
        the daemon reads only ACTIVE claims, and the claimer may clear the slot's
        mailbox meanwhile.
        """
        for index in range(self.max_clients):
            generation, state = self._load(index)
            if state is not ClientState.FREE or roster.state(index) is not ClientState.FREE:
                continue
            claimed = generation + 1
            if not self._swap(index, _word(generation, state), _word(claimed, ClientState.CLAIMED)):
                continue
            if roster.state(index) is not ClientState.FREE:  # a claim written over: not free
                continue  # (left CLAIMED: the daemon rewrites it when it frees the slot)
            self._store(index, _Field.SINCE_NS, time.monotonic_ns())  # the grace starts
            self._store(index, _Field.PID, pid)
            self._store(index, _Field.START, _float_bits(start))
            self._store(index, _Field.WAKE, int(wakes_by_fd))
            return index, claimed
        return None

    def activate(self, index: int, generation: int) -> bool:
        """CLAIMED -> ACTIVE (a release: the fields are published with it). False if
        the daemon took the claim for abandoned meanwhile: claim again."""
        done = self._swap(
            index, _word(generation, ClientState.CLAIMED), _word(generation, ClientState.ACTIVE)
        )
        if done:
            self._claims.add(1)  # the daemon adopts at its next turn
        return done

    def abandon(self, index: int, generation: int) -> bool:
        """CLAIMED -> FREE: a claim given up (by its claimer, or by the daemon
        after a grace period when its claimer died before activating)."""
        return self._swap(
            index, _word(generation, ClientState.CLAIMED), _word(generation, ClientState.FREE)
        )

    def is_held(self, index: int, generation: int) -> bool:
        """Whether the claim ``generation`` of slot ``index`` is still active (the
        daemon has not freed the slot since)."""
        return self._load(index) == (generation, ClientState.ACTIVE)

    # -- the daemon's moves -------------------------------------------------

    def free(self, index: int, generation: int) -> None:
        """The daemon freed slot ``index`` (whatever its claim says now: garbage
        included): FREE at ``generation``, for the next claimer."""
        self._store(index, _Field.STATE, _word(generation, ClientState.FREE))

    def garbled(self, index: int) -> bool:
        """Whether the claim's state word holds no state at all (written over)."""
        return self._load(index)[1] is None
