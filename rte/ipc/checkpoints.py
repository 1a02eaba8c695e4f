"""Checkpoints: each session's state every K of its steps, in a segment that outlives a crash.

With ``--checkpoint-every K`` the daemon, after a step, takes each session that
has made K more chunks out of its engine and puts it straight back
(``suspend`` then ``resume`` at the same chunk boundary: its frames stay those
of a twin, :mod:`rte.suspension`), and writes the state's bytes
(:meth:`~rte.state.SessionState.to_bytes`: a digest over its body) into the
checkpoint segment. The serve loop's own values for the session (its priority,
the actions queued for its next step and their seq: its
:meth:`~rte.serve.ServeLoop.host_state`) travel in ``state.host``, which the
loop a pool reattaches the session to restores (:class:`~rte.state.HostHalf`).

The segment (``DaemonNames.checkpoint(generation)``: one per daemon of the
name, the restarted one taking the next generation; 0600 and of this user like
every segment, kind ``RTE7``) is made at the first checkpoint, its slots sized
from that state (twice it, at least 64 KiB; a state that outgrows its slot is
skipped and logged). Layout after the segment header::

    table   magic u64 | generation u64 | slots u32 | slot bytes u32
    slot    two halves, each: epoch u64 | length u64 | state bytes

A write goes to the older half, the epoch last, so a SIGKILL mid-write tears
at most that half: a reader (:func:`read_checkpoint`) takes, per slot, the half
of the highest epoch whose bytes pass the state's digest, and refuses a
segment of another kind, table or generation, a live daemon's, and a slot with
no sound half. A clean stop unlinks the daemon's own segment; a restarted
daemon keeps a dead one's until every session in it is attached again here;
``rte clean`` removes them all.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from typing import TYPE_CHECKING, Any

from rte.errors import StateError
from rte.protocol.names import DaemonNames
from rte.state import SessionState
from shm import Segment, ShmError
from shm.names import unlink_segment
from shm.segment import HEADER_SIZE

if TYPE_CHECKING:
    from rte.serve import ServeLoop

log = logging.getLogger("rte.daemon")
KIND_CHECKPOINT = 0x52544537  # "RTE7"
MAGIC = 0x31544B5043455452  # "RTECPKT1"
_TABLE = struct.Struct("<QQII")
_HALF = struct.Struct("<QQ")
MIN_SLOT_BYTES = 64 << 10


class Checkpoints:
    """The checkpoint writer of one daemon (its serve loop's sessions)."""

    def __init__(self, names: DaemonNames, every: int, rows: int) -> None:
        self.names = names
        self.every = every
        self.rows = rows
        dead = names.checkpoints()
        self.generation = max(dead, default=0) + 1
        self._dead = dict(dead)  # generation -> name, kept until their sessions are taken
        self._untaken = _sessions_of(dead.values())
        self.segment: Segment | None = None
        self._slot_bytes = 0
        self._slots: dict[str, int] = {}  # session -> slot
        self._epochs: dict[str, int] = {}
        self._steps: dict[str, int] = {}
        self.written = 0  # checkpoints written, for inspectors and the benchmark

    @property
    def slot_bytes(self) -> int:
        """The bytes of one half of a slot (0: no checkpoint written yet)."""
        return self._slot_bytes

    def after_step(self, loop: ServeLoop, stepped: list[str]) -> None:
        """Count ``stepped``'s steps; checkpoint each that made ``every`` more."""
        attached = set(loop.sessions)
        if self._dead and self._untaken <= attached:
            self._remove_dead()
        for session in [s for s in self._slots if s not in attached]:  # detached: gone
            self._clear(self._slots.pop(session))
            self._epochs.pop(session, None)
        for session in [s for s in self._steps if s not in attached]:
            del self._steps[session]
        due = []
        for session in stepped:
            n = self._steps[session] = self._steps.get(session, 0) + 1
            if n % self.every == 0 and session not in loop.parking:
                due.append(session)
        if not due:
            return
        engine: Any = loop.engine  # suspend/resume: past the Engine protocol
        many = getattr(engine, "suspend_many", None)
        if many is None or len(due) == 1:
            for session in due:
                self.write(loop, session)
            return
        try:  # all at once: one export, one decode of their chunks in flight
            states: dict[str, SessionState] = many(due)
        except StateError:  # one cannot: each on its own (its own refusal logged)
            for session in due:
                self.write(loop, session)
            return
        for session in due:
            engine.resume(session, states[session])  # back at the same boundary
        for session in due:
            self.write(loop, session, states[session])

    def write(self, loop: ServeLoop, session: str, state: SessionState | None = None) -> None:
        """Checkpoint ``session`` now (at a step boundary); ``state``: already taken."""
        if state is None:
            engine: Any = loop.engine  # suspend/resume: past the Engine protocol
            state = engine.suspend(session)
            engine.resume(session, state)  # back at the same boundary (a free row: its own)
        try:
            data = dataclasses.replace(state, host=loop.host_state(session)).to_bytes()
        except StateError as exc:
            log.warning("session %r not checkpointed: %s", session, exc)
            return
        segment = self._segment(len(data))
        if len(data) > self._slot_bytes - _HALF.size:
            log.warning(
                "session %r not checkpointed: its state of %d bytes outgrew the slot of %d",
                session,
                len(data),
                self._slot_bytes,
            )
            return
        slot = self._slots.get(session)
        if slot is None:
            used = set(self._slots.values())
            free = [i for i in range(self.rows) if i not in used]
            if not free:
                log.warning(
                    "session %r not checkpointed: all %d slots are taken", session, self.rows
                )
                return
            slot = self._slots[session] = free[0]
        epoch = self._epochs[session] = self._epochs.get(session, 0) + 1
        at = self._half_at(slot, epoch % 2)
        segment.bytes_at(at + _HALF.size, len(data))[:] = data
        segment.bytes_at(at + 8, 8)[:] = struct.pack("<Q", len(data))
        segment.bytes_at(at, 8)[:] = struct.pack("<Q", epoch)  # last: the half is whole
        self.written += 1

    def close(self) -> None:
        """A clean stop: unlink this daemon's own segment (a dead one's stay)."""
        if self.segment is not None:
            self.segment.close()
            self.segment.unlink()
            self.segment = None

    def _segment(self, nbytes: int) -> Segment:
        if self.segment is None:
            self._slot_bytes = max(MIN_SLOT_BYTES, 2 * (nbytes + _HALF.size))
            size = HEADER_SIZE + _TABLE.size + self.rows * 2 * self._slot_bytes
            name = self.names.checkpoint(self.generation)
            self.segment = Segment.create(name, size, kind=KIND_CHECKPOINT)
            table = _TABLE.pack(MAGIC, self.generation, self.rows, self._slot_bytes)
            self.segment.bytes_at(HEADER_SIZE, _TABLE.size)[:] = table
        return self.segment

    def _half_at(self, slot: int, half: int) -> int:
        return HEADER_SIZE + _TABLE.size + (2 * slot + half) * self._slot_bytes

    def _clear(self, slot: int) -> None:
        if self.segment is not None:
            for half in (0, 1):
                self.segment.bytes_at(self._half_at(slot, half), 8)[:] = bytes(8)

    def _remove_dead(self) -> None:
        for name in self._dead.values():
            if _unlink_dead(name):
                log.info("removed %s: its sessions are taken", name)
        self._dead.clear()
        self._untaken = set()


def read_checkpoint(daemon: str, generation: int | None = None) -> dict[str, SessionState]:
    """The sessions' states a dead daemon ``daemon`` checkpointed: {session: state}.

    ``generation`` picks one of its checkpoint segments (default: the newest).
    StateError when there is none, when the daemon that wrote it is alive, or for
    a segment that is not a checkpoint of this name and generation, or a slot
    whose halves are both torn (nothing is loaded from a refused segment).
    """
    names = DaemonNames(daemon)
    found = names.checkpoints()
    if not found:
        raise StateError(f"daemon {daemon!r} left no checkpoint in /dev/shm")
    generation = max(found) if generation is None else generation
    name = found.get(generation)
    if name is None:
        raise StateError(f"daemon {daemon!r} left no checkpoint of generation {generation}")
    try:
        segment = Segment.open(name, kind=KIND_CHECKPOINT, readonly=True)
    except ShmError as exc:
        raise StateError(f"checkpoint {name} refused: {exc}") from None
    try:
        if segment.creator_alive():
            raise StateError(
                f"checkpoint {name} belongs to a live daemon (pid {segment.creator_pid}); "
                "read a dead daemon's checkpoint, or suspend its sessions instead"
            )
        return _states(segment, name, generation)
    finally:
        segment.close()


def _states(segment: Segment, name: str, generation: int) -> dict[str, SessionState]:
    raw = bytes(segment.bytes_at(HEADER_SIZE, segment.size - HEADER_SIZE))
    magic, gen, slots, slot_bytes = _TABLE.unpack_from(raw, 0)
    if magic != MAGIC or gen != generation:
        raise StateError(f"checkpoint {name} refused: not a checkpoint table of generation {gen}")
    if _TABLE.size + slots * 2 * slot_bytes > len(raw) or slot_bytes <= _HALF.size:
        raise StateError(f"checkpoint {name} refused: its table does not fit the segment")
    states: dict[str, SessionState] = {}
    for slot in range(slots):
        halves = []
        for half in (0, 1):
            at = _TABLE.size + (2 * slot + half) * slot_bytes
            epoch, length = _HALF.unpack_from(raw, at)
            if epoch:
                halves.append((epoch, raw[at + _HALF.size : at + _HALF.size + length]))
        if not halves:
            continue
        why = ""
        for _, data in sorted(halves, reverse=True):  # the newest sound one
            try:
                state = SessionState.from_bytes(data)
            except StateError as exc:
                why = str(exc)
                continue
            states[state.session] = state
            break
        else:
            raise StateError(f"checkpoint {name} refused: slot {slot} has no sound state ({why})")
    return states


def _sessions_of(names: Any) -> set[str]:
    """The sessions in dead daemons' checkpoints (none from one that is refused)."""
    sessions: set[str] = set()
    for name in names:
        try:
            with Segment.open(name, kind=KIND_CHECKPOINT, readonly=True) as segment:
                generation = int(name.rpartition(".k")[2])
                sessions |= set(_states(segment, name, generation))
        except (ShmError, StateError, ValueError) as exc:
            log.warning("a dead daemon's checkpoint %s is unreadable: %s", name, exc)
    return sessions


def _unlink_dead(name: str) -> bool:
    return unlink_segment(name)
