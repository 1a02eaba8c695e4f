"""Big inputs, the daemon's side: arrays clients lend the engine by slab slot.

A client writes a large input (a camera frame, an image) into a slot of the
daemon's input slab that it loaned as that slot's owner, publishes it, and
sends an :class:`~rte.ipc.values.InputRef` in its request instead of the
bytes. Here each reference becomes a read-only view of the slot, checked as
an output slot is: published at that generation, held by this client (a
stale or another client's reference is that request's error, and nothing is
held). The view is what the engine gets: no copy.

A slot is held for as long as a session's conditioning refers to it. When a
later request replaces its key, it retires, and goes back to the client's
quota once a step *of that session* has ended: its last batch may still decode
from it (DEFERRED runs a step behind HOT, and a session that is not due keeps
its batch until it is). When the session leaves, its slots go back after the
next step of anyone. A refused request's slots go back at once (also those it
named but that were never read); a dead client's are reclaimed with the rest
of what it held.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import numpy as np

from rte.contract import Action
from rte.ipc.values import InputRef
from rte.serve import Act, Attach, Request, Reset
from shm import ShmError, Slab, SlotRef
from shm.slab import Sample

R = TypeVar("R", bound=Request)


def conditioning_of(request: Request) -> Mapping[str, Any] | None:
    """The conditioning a request carries (None: it carries none)."""
    if isinstance(request, Act):
        return request.action.conditioning
    if isinstance(request, Attach | Reset):
        return request.conditioning
    return None


def with_conditioning(request: R, conditioning: Mapping[str, Any]) -> R:
    """``request`` carrying ``conditioning`` instead."""
    changed: Any = request  # (dataclasses.replace cannot see which request R is)
    if isinstance(request, Act):
        return dataclasses.replace(changed, action=Action(dict(conditioning)))  # type: ignore[no-any-return]
    return dataclasses.replace(changed, conditioning=conditioning)  # type: ignore[no-any-return]


class InputRefused(ValueError):
    """A reference the daemon will not read (stale, another client's, malformed)."""


class Inputs:
    """The input slab (None: the daemon takes no inputs by slot) and what sessions hold of it."""

    def __init__(self, slab: Slab | None) -> None:
        self.slab = slab
        self._held: dict[str, dict[str, Sample]] = {}  # session -> key -> its slot
        # replaced, with the session whose batch may still read it (None: it left)
        self._retired: list[tuple[str | None, Sample]] = []
        self._releasing: list[Sample] = []  # free once the current step ends

    def resolve(
        self, owner: int, conditioning: Mapping[str, Any] | None
    ) -> tuple[Mapping[str, Any] | None, dict[str, Sample]]:
        """``conditioning`` with each InputRef made a read-only view of its slot,
        and the slots taken. InputRefused (nothing taken) for a reference that
        is not ``owner``'s published slot."""
        if not conditioning or not any(type(v) is InputRef for v in conditioning.values()):
            return conditioning, {}
        samples: dict[str, Sample] = {}
        try:
            for key, value in conditioning.items():
                if type(value) is InputRef:
                    samples[key] = self._receive(owner, key, value)
        except BaseException:
            self.refused(samples)
            self.unused(owner, {k: v for k, v in conditioning.items() if k not in samples})
            raise
        resolved = dict(conditioning)
        resolved.update({key: sample.array for key, sample in samples.items()})
        return resolved, samples

    def _receive(self, owner: int, key: str, ref: InputRef) -> Sample:
        if self.slab is None:
            raise InputRefused(f"{key}: this daemon takes no inputs by slot (--input-slots 0)")
        try:
            info = self.slab.slot(ref.slot)
            if info.owner != owner:
                raise InputRefused(
                    f"{key}: input slot {ref.slot} is not this client's (PermissionError)"
                )
            return self.slab.receive(
                SlotRef(ref.slot, ref.generation, owner), np.dtype(ref.dtype), ref.shape
            )
        except (ShmError, ValueError, IndexError, TypeError) as exc:
            if isinstance(exc, InputRefused):
                raise
            raise InputRefused(f"{key}: {type(exc).__name__}: {exc}") from None

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

    def unused(self, owner: int, conditioning: Mapping[str, Any] | None) -> None:
        """A request refused before its references were read: the slots they name,
        if ``owner``'s, go back (the client sent them; nobody else will free them)."""
        if self.slab is None or not conditioning:
            return
        for value in conditioning.values():
            if type(value) is InputRef:
                with contextlib.suppress(ShmError, ValueError):
                    self.slab.release(SlotRef(value.slot, value.generation, owner))

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
