"""Big inputs, the daemon's side: arrays clients lend the engine by slab slot.

Each client slot has its own input segment (``DaemonNames.client_inputs``):
a slab of that client's share of the input slots, created by the daemon at
start, mode 0600, and mapped by that client and the daemon only. A client
writes a large input (a camera frame, an image) into a slot it loaned there,
publishes it, and sends an :class:`~rte.protocol.values.InputRef` in its request
instead of the bytes. Here each reference becomes a read-only view of a slot
*of the sender's own segment*, checked as an output slot is: published at that
generation (a stale or malformed reference is that request's error, and
nothing is held). A reference cannot name another client's frames at all, and
no bug in one client can write into them: it never maps them. The view is
what the engine gets: no copy.

A slot is held for as long as a session's conditioning refers to it. When a
later request replaces its key, it retires, and goes back to the client's
quota once a step *of that session* has ended: its last batch may still decode
from it (DEFERRED runs a step behind HOT, and a session that is not due keeps
its batch until it is). When the session leaves, its slots go back after the
next step of anyone. A refused request's slots go back at once (also those it
named but that were never read). A dead client's segment is reset before its
client slot is reused: every slot reclaimed, every byte zeroed, so the slot's
next client starts with an empty segment and never sees a frame of the last.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rte.errors import RequestError
from rte.protocol.inputs import (
    OWNER,
    create_slab,
)
from rte.protocol.requests import Export, Request
from rte.protocol.values import InputRef
from rte.state import SessionState
from shm import ShmError, Slab, SlotRef
from shm.slab import Sample


class InputRefused(ValueError):
    """A reference the daemon will not read (stale, another client's, malformed)."""


class Inputs:
    """Every client's input slab, by client slot (none: the daemon takes no inputs
    by slot), and what sessions hold of them."""

    def __init__(self, slabs: Sequence[Slab] = ()) -> None:
        self.slabs = list(slabs)
        self._held: dict[str, dict[str, Sample]] = {}  # session -> key -> its slot
        # replaced, with the session whose batch may still read it (None: it left)
        self._retired: list[tuple[str | None, Sample]] = []
        self._releasing: list[Sample] = []  # free once the current step ends

    @property
    def by_slot(self) -> bool:
        """Whether this daemon takes inputs by slot at all (``--input-slots``)."""
        return bool(self.slabs)

    def resolve(
        self, client: int, conditioning: Mapping[str, Any] | None
    ) -> tuple[Mapping[str, Any] | None, dict[str, Sample]]:
        """``conditioning`` with each InputRef made a read-only view of its slot in
        ``client``'s own input segment, and the slots taken. InputRefused (nothing
        taken) for a reference that is not a slot ``client`` published there."""
        if not conditioning or not any(type(v) is InputRef for v in conditioning.values()):
            return conditioning, {}
        samples: dict[str, Sample] = {}
        try:
            for key, value in conditioning.items():
                if type(value) is InputRef:
                    samples[key] = self._receive(client, key, value)
        except BaseException:
            self.refused(samples)
            self.unused(client, {k: v for k, v in conditioning.items() if k not in samples})
            raise
        resolved = dict(conditioning)
        resolved.update({key: sample.array for key, sample in samples.items()})
        return resolved, samples

    def _receive(self, client: int, key: str, ref: InputRef) -> Sample:
        if not self.slabs:
            raise InputRefused(f"{key}: this daemon takes no inputs by slot (--input-slots 0)")
        slab = self.slabs[client]  # the sender's own: no other client's slot can be named
        try:
            ours = SlotRef(ref.slot, ref.generation, OWNER)
            return slab.receive(ours, np.dtype(ref.dtype), ref.shape)
        except (ShmError, ValueError, IndexError, TypeError) as exc:
            raise InputRefused(
                f"{key}: not a slot this client published in its input segment "
                f"({type(exc).__name__}: {exc})"
            ) from None

    def export_into(self, client: int, request: Request) -> Request:
        """An :class:`Export`'s ``into`` (a slot ``client`` published in its own
        input segment, the only one the daemon writes in) made the loop's writer of
        the state's bytes there; any other request as it is. InputRefused for a
        slot that is not one. The slot stays the client's: it reads and frees it."""
        if not isinstance(request, Export):
            return request
        ref = request.into
        if type(ref) is not InputRef:
            raise InputRefused("an export names no slot of this client's input segment")
        sample = self._receive(client, "into", ref)  # checked: published, this generation
        slab, size = self.slabs[client], sample.array.nbytes
        at = slab.data_offset + ref.slot * slab.slot_size
        target = slab.segment.view(at, np.dtype(np.uint8), size, (size,), readonly=False)

        def write(state: SessionState) -> int:
            data = state.to_bytes()
            if len(data) > size:
                kib = -(-len(data) // 1024)
                raise RequestError(
                    f"session {request.session!r} not exported: its state of {len(data):,} "
                    f"bytes exceeds the input slot of {size:,} bytes it goes to; start the "
                    f"daemon with --input-slot-kib {kib} (the session stays as it was)"
                )
            try:  # checked again: taking the state out may have taken a while
                self._receive(client, "into", ref)
            except InputRefused:
                raise RequestError(
                    f"session {request.session!r} not exported: its client gave the slot "
                    "for its state back before the state was written (the session stays "
                    "as it was)"
                ) from None
            target[: len(data)] = np.frombuffer(data, np.uint8)
            self.drop(request.session)  # it leaves: its input slots go back soon
            return len(data)

        return dataclasses.replace(request, into=write)

    def reset(self, client: int) -> int:
        """``client`` is gone: every slot of its input segment goes back, and every byte
        is zeroed, before its client slot is free for the next client (who must never
        see its frames). Returns the slots reclaimed."""
        if not self.slabs:
            return 0
        slab = self.slabs[client]
        reclaimed = slab.reclaim(OWNER)
        size = slab.slots * slab.slot_size
        data = slab.segment.view(
            slab.data_offset, np.dtype(np.uint8), size, (size,), readonly=False
        )
        data.fill(0)
        # and its slot words laid out anew: the client may have written anything there
        self.slabs[client] = create_slab(slab.segment, slab.slots, slab.slot_size)
        return reclaimed

    def taken(self, session: str, keys: Iterable[str], samples: dict[str, Sample]) -> None:
        """The engine took conditioning with ``keys`` for ``session``: what those keys
        held retires; the session now holds ``samples``."""
        held = self._held.setdefault(session, {})
        for key in keys:
            old = held.pop(key, None)
            if old is not None:
                self._retired.append((session, old))
        held.update(samples)
        if not held:
            del self._held[session]

    def refused(self, samples: dict[str, Sample]) -> None:
        """The request was refused: its slots go back now (the engine never saw them)."""
        _release(samples.values())

    def unused(self, client: int, conditioning: Mapping[str, Any] | None) -> None:
        """A request refused before its references were read: the slots they name in
        ``client``'s segment go back (the client sent them; nobody else will free them)."""
        if not self.slabs or not conditioning:
            return
        slab = self.slabs[client]
        for value in conditioning.values():
            if type(value) is InputRef:
                with contextlib.suppress(ShmError, ValueError):
                    slab.release(SlotRef(value.slot, value.generation, OWNER))

    def drop(self, session: str) -> None:
        """The session left, or its conditioning was replaced whole (a reset: its
        batch went with it): its slots, and those retired from it, go back soon."""
        self._retired = [(None if s == session else s, x) for s, x in self._retired]
        self._retired += [(None, x) for x in self._held.pop(session, {}).values()]

    def step_begins(self, due: list[str]) -> None:
        """A step of ``due`` begins: slots retired from them (or from sessions that
        left) go back when it ends; the others wait for their session's step."""
        if self._retired:
            stepping = set(due)
            keep: list[tuple[str | None, Sample]] = []
            for session, sample in self._retired:
                if session is None or session in stepping:
                    self._releasing.append(sample)
                else:
                    keep.append((session, sample))
            self._retired = keep

    def step_ended(self) -> None:
        """The step's DEFERRED read what it needed: slots retired before it go back."""
        if self._releasing:
            _release(self._releasing)
            self._releasing = []

    def settle(self) -> None:
        """No session left at all: nothing can read a retired slot; all go back."""
        if self._retired or self._releasing:
            _release([*self._releasing, *(sample for _, sample in self._retired)])
            self._retired, self._releasing = [], []

    def held(self) -> int:
        """Slots held for sessions' conditioning or retiring (for inspectors and tests)."""
        return sum(map(len, self._held.values())) + len(self._retired) + len(self._releasing)


def _release(samples: Iterable[Sample]) -> None:
    for sample in samples:
        with contextlib.suppress(ShmError):  # reclaimed meanwhile (its client died)
            sample.release()
