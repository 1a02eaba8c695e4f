"""Late attaches: a pool's move attaches given up on, and the copies they would leave.

A move whose attach to its target got no answer in its time (the target
stopped, slow) is sent back where it came from (:mod:`rte.client.in_flight`);
the first attach is still in the target's inbox and, taken up late, would make
a second live copy of one world, stepping, its chunks handed out as the
session's. :class:`LateAttaches` remembers each such attach and sorts what its
daemon says of it (see the class).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rte.client.batch import ChunkBatch, Release
from rte.contract import Notice, NoticeKind
from rte.state import SessionState


@dataclass
class LateAttach:
    """A move's attach given up on, to daemon ``name`` (taken up late: a copy detached)."""

    session: str
    name: str
    detach: int = 0  # seq of the DETACH sent to that copy (0: not yet sent)


class LateAttaches:
    """A pool's move attaches given up on (the target stopped, slow): each still in
    its daemon's inbox while the move went on (attached back where it came from);
    taken up late, a second live copy of one world. So each is remembered (its
    seq, its daemon), and its late answer is:

    * ATTACHED while the session lives elsewhere (or was let go since): that copy
      is detached at once; until its DETACHED its chunks are given back unseen and
      its notices dropped (never the caller's, never counted as its session's);
    * ATTACHED of a session its move left stranded (its old daemon refused it
      too): adopted, its home that daemon, ``stranded`` dropped, the caller told
      by that ATTACHED notice;
    * REJECTED or ERROR: the record ends (nothing was attached).
    """

    def __init__(self, take: Callable[[int], str], detach: Callable[[str, str], int]) -> None:
        self._take = take  # seq of an attach in flight -> its daemon, no longer in flight
        self._detach = detach  # (daemon, session) -> the DETACH's seq (0: not sent)
        self.by_seq: dict[int, LateAttach] = {}
        self.copies: dict[tuple[str, str], LateAttach] = {}  # (daemon, session) -> detaching
        self.strand: set[str] = set()  # sessions a move left stranded, a late attach of theirs out
        self.stranded: dict[str, SessionState] = {}  # the client's (a drain's stranded states)

    def __bool__(self) -> bool:
        return bool(self.by_seq or self.copies or self.strand)

    def add(self, seq: int, session: str) -> None:
        """Attach ``seq`` of ``session`` given up on: no longer the placer's (tried nowhere)."""
        name = self._take(seq)
        if name:
            self.by_seq[seq] = LateAttach(session, name)

    def stranded_now(self, session: str) -> None:
        """``session``'s move ended attached nowhere: a late attach of it is its home."""
        if any(late.session == session for late in self.by_seq.values()):
            self.strand.add(session)

    def sort(self, name: str, item: Notice) -> Notice | None:
        """Daemon ``name``'s notice ``item`` as the caller is to see it (a late
        ATTACHED adopted: saying so); None: a late attach's or its copy's."""
        session = item.session
        copy = self.copies.get((name, session))
        answers = copy is not None and copy.detach != 0 and item.seq == copy.detach
        if copy is not None and (answers or item.kind is NoticeKind.DETACHED or not item.seq):
            if answers or item.kind is NoticeKind.DETACHED:  # (its news is never the caller's)
                del self.copies[name, session]
            return None
        late = self.by_seq.get(item.seq) if item.seq else None
        if late is None or late.name != name or late.session != session:
            if item.kind is NoticeKind.ATTACHED:  # attached otherwise: nothing to adopt
                self.strand.discard(session)
            return item
        del self.by_seq[item.seq]
        if item.kind is not NoticeKind.ATTACHED:  # refused: nothing was attached
            if all(other.session != session for other in self.by_seq.values()):
                self.strand.discard(session)
            return None
        if session in self.strand:
            self.strand.discard(session)
            self.stranded.pop(session, None)
            said = (
                f"its move's attach to {name!r}, given up on, was carried out late while it was "
                f"attached nowhere: it lives on {name!r} now, going on from its state"
                f" (client.stranded[{session!r}], if it was there, dropped)"
            )
            return Notice(session, NoticeKind.ATTACHED, said, item.seq)
        self.copies[name, session] = late
        late.detach = self._detach(name, session)
        return None

    def retry(self) -> None:
        """Send again each copy's DETACH that found no room."""
        for (name, session), copy in self.copies.items():
            if not copy.detach:
                copy.detach = self._detach(name, session)

    def lost(self, name: str) -> None:
        """Daemon ``name`` died: its late attaches and copies with it."""
        self.by_seq = {seq: late for seq, late in self.by_seq.items() if late.name != name}
        self.copies = {key: copy for key, copy in self.copies.items() if key[0] != name}

    def without_copies(
        self, name: str, batch: ChunkBatch, release: Release, give_back: Release
    ) -> list[ChunkBatch]:
        """``batch`` of daemon ``name`` (just received) with the rows of its copies
        being detached given back unseen (``give_back``, never counted as the
        caller's): the runs of the other rows, each a batch of its own released
        through ``release``."""
        sessions = batch.sessions
        drop = [i for i, s in enumerate(sessions) if (name, s) in self.copies]
        if not drop:
            return [batch]
        give_back(batch, np.array(drop, np.intp))
        starts, ends = [0, *(i + 1 for i in drop)], [*drop, len(sessions)]
        return [_rows(batch, a, b, release) for a, b in zip(starts, ends, strict=True) if b > a]


def _rows(batch: ChunkBatch, start: int, end: int, release: Release) -> ChunkBatch:
    """Rows ``start:end`` of a batch just received (its lease's rows), as a batch."""
    return ChunkBatch(
        batch.sessions[start:end],
        batch.chunks[start:end],
        batch.latents[start:end],
        batch.generated_ns[start:end],
        emitted_ns=batch.emitted_ns,
        pushed_ns=batch.pushed_ns,
        taken_ns=batch.taken_ns,
        release=release,
        lease=batch.lease,
        start=start,
        applied=batch.applied[start:end],
    )
