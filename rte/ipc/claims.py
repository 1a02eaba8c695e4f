"""The client table in the control segment: who holds which client slot.

One 128-byte entry per client slot. Its first word is the slot's state and a
generation, ``generation << 8 | state``, so that every change of hands is one
compare-and-swap that names the generation it expects: a claim bumps the
generation, and a stale actor (a claimer the daemon gave up on, a daemon
freeing a claim that was just finished) fails its swap instead of taking a
slot someone else now holds. After the slab's slot words (``shm_native.c``).

    FREE --claim--> CLAIMED --activate--> ACTIVE --(BYE, death)--> CLOSING --> FREE
                       |                     |--(leave: BYE did not fit)--> CLOSING
                       +--abandon--> FREE    +--(revoked by the daemon)--> REVOKED --> FREE

A claimer writes its pid and start time between claim and activate, with the
slot's rings its alone; the daemon reads an entry's fields only after the
acquire load of its state word shows them published.
"""

from __future__ import annotations

import enum
import struct
import time
from dataclasses import dataclass
from typing import Any

from shm import Segment
from shm.native import lib

ENTRY = 128  # bytes per client slot (its own cache lines)
_START = struct.Struct("<d")


class ClientState(enum.IntEnum):
    FREE = 0
    CLAIMED = 1  # a client took the slot and is setting it up; the daemon ignores it
    ACTIVE = 2  # the daemon serves it
    CLOSING = 3  # said BYE (or could not), or found dead: the daemon is reclaiming it
    REVOKED = 4  # disconnected by the daemon while alive: FREE once it leaves or dies


class _Field(enum.IntEnum):
    """The words of one entry."""

    STATE = 0  # generation << 8 | ClientState
    PID = 1
    START = 2  # the process's start time, float64 bits (pid + start name one process)
    SESSIONS = 3
    LAST_POP_NS = 4  # time.monotonic_ns() when the client last read its outbox (or claimed)
    WAKE = 5  # how the daemon wakes the client: 0 its semaphore, 1 its FIFO (an event loop)


def _word(generation: int, state: ClientState) -> int:
    return generation << 8 | state


@dataclass(frozen=True)
class ClientEntry:
    """A snapshot of one entry (fields read after its state word)."""

    index: int
    state: ClientState
    generation: int
    pid: int
    start: float
    sessions: int
    last_pop_ns: int
    wakes_by_fd: bool = False  # woken through its FIFO (an asyncio client), not its semaphore


class ClaimTable:
    """The entries of ``max_clients`` slots at ``offset`` of a control segment;
    ``claims`` is the daemon-block word a client bumps when it activates."""

    def __init__(self, segment: Segment, offset: int, max_clients: int, claims: Any) -> None:
        self.segment = segment
        self.offset = offset
        self.max_clients = max_clients
        self._claims = claims
        self._words: dict[tuple[int, _Field], Any] = {}

    def _at(self, index: int, field: _Field) -> Any:
        word = self._words.get((index, field))
        if word is None:
            if not 0 <= index < self.max_clients:
                raise IndexError(f"client slot {index} (0..{self.max_clients - 1})")
            offset = self.offset + ENTRY * index + 8 * field
            word = self._words[(index, field)] = self.segment.word(offset)
        return word

    def _load(self, index: int) -> tuple[int, ClientState]:
        word = int(lib.shm_load_acquire(self._at(index, _Field.STATE)))
        try:
            return word >> 8, ClientState(word & 0xFF)
        except ValueError:  # a client scribbled on its entry: it is leaving, as far as we care
            return word >> 8, ClientState.CLOSING

    def _swap(self, index: int, expected: int, desired: int) -> bool:
        return bool(lib.shm_cas(self._at(index, _Field.STATE), expected, desired))

    # -- reading ----------------------------------------------------------

    def state(self, index: int) -> ClientState:
        """One slot's state alone (one atomic load: cheap enough for every call)."""
        return self._load(index)[1]

    def entry(self, index: int) -> ClientEntry:
        generation, state = self._load(index)  # acquire first: the fields are published
        start_bits = int(lib.shm_load_relaxed(self._at(index, _Field.START)))
        return ClientEntry(
            index,
            state,
            generation,
            int(lib.shm_load_relaxed(self._at(index, _Field.PID))),
            _START.unpack(start_bits.to_bytes(8, "little"))[0],
            int(lib.shm_load_relaxed(self._at(index, _Field.SESSIONS))),
            int(lib.shm_load_acquire(self._at(index, _Field.LAST_POP_NS))),
            bool(lib.shm_load_relaxed(self._at(index, _Field.WAKE))),
        )

    def entries(self) -> list[ClientEntry]:
        return [self.entry(i) for i in range(self.max_clients)]

    def last_pop_ns(self, index: int) -> int:
        return int(lib.shm_load_acquire(self._at(index, _Field.LAST_POP_NS)))

    # -- a client's moves -------------------------------------------------

    def claim(self, pid: int, start: float, *, wakes_by_fd: bool = False) -> tuple[int, int] | None:
        """Take a free slot for this process: (index, generation), None when all are taken.

        The slot is the claimer's alone until :meth:`activate`: the daemon reads
        only ACTIVE slots, and the claimer may reset the slot's rings meanwhile.
        """
        for index in range(self.max_clients):
            generation, state = self._load(index)
            if state is not ClientState.FREE:
                continue
            claimed = generation + 1
            if self._swap(index, _word(generation, state), _word(claimed, ClientState.CLAIMED)):
                self.note_pop(index)  # first: the daemon's abandoned-claim clock starts now
                lib.shm_store_release(self._at(index, _Field.PID), pid)
                start_bits = int.from_bytes(_START.pack(start), "little")
                lib.shm_store_release(self._at(index, _Field.START), start_bits)
                lib.shm_store_release(self._at(index, _Field.WAKE), int(wakes_by_fd))
                return index, claimed
        return None

    def activate(self, index: int, generation: int) -> bool:
        """CLAIMED -> ACTIVE (a release: the fields are published with it). False if
        the daemon took the claim for abandoned meanwhile: claim again."""
        done = self._swap(
            index, _word(generation, ClientState.CLAIMED), _word(generation, ClientState.ACTIVE)
        )
        if done:
            lib.shm_fetch_add(self._claims, 1)  # the daemon adopts at its next turn
        return done

    def abandon(self, index: int, generation: int) -> bool:
        """CLAIMED -> FREE: a claim given up (by its claimer, or by the daemon
        after a grace period when its claimer died before activating)."""
        return self._swap(
            index, _word(generation, ClientState.CLAIMED), _word(generation, ClientState.FREE)
        )

    def leave(self, index: int, generation: int) -> bool:
        """ACTIVE -> CLOSING: a client leaving that could not say BYE; the daemon
        reaps it at its next scan."""
        return self._swap(
            index, _word(generation, ClientState.ACTIVE), _word(generation, ClientState.CLOSING)
        )

    def give_back_revoked(self, index: int, generation: int) -> bool:
        """REVOKED -> FREE, by the revoked client leaving or the daemon finding it
        dead (compare-and-swap: exactly one of them); True for the one that did."""
        return self._swap(
            index, _word(generation, ClientState.REVOKED), _word(generation, ClientState.FREE)
        )

    def note_pop(self, index: int) -> None:
        """A client records that it consumed its outbox (for the idle limit)."""
        lib.shm_store_release(self._at(index, _Field.LAST_POP_NS), time.monotonic_ns())

    # -- the daemon's moves -------------------------------------------------

    def set_state(self, index: int, state: ClientState) -> None:
        """ACTIVE -> CLOSING -> FREE or REVOKED, by the daemon alone (the slot's
        client is gone, or reads only this word); the generation stays."""
        generation, _ = self._load(index)
        lib.shm_store_release(self._at(index, _Field.STATE), _word(generation, state))

    def set_sessions(self, index: int, sessions: int) -> None:
        lib.shm_store_release(self._at(index, _Field.SESSIONS), sessions)
