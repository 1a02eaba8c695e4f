"""A client's input segment: its layout, which both sides open, and how a
request carries its conditioning.

Each client slot has an input segment of its own (``DaemonNames.client_inputs``),
one slab laid out by the daemon at start with the client as its one owner. The
client loans, writes and publishes slots there (:mod:`rte.client.inputs`); the
daemon reads them by reference (:mod:`rte.ipc.inputs`). These are the functions
both use: the segment's size and slab, and a request's conditioning in and out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from rte.contract import Action
from rte.protocol.requests import Act, Attach, Request, Reset
from shm import Segment, Slab
from shm.segment import HEADER_SIZE

R = TypeVar("R", bound=Request)
OWNER = 0  # a client is the one owner of the slots of its own input segment


def segment_bytes(slots: int, slot_bytes: int) -> int:
    """The size of one client's input segment of ``slots`` slots of ``slot_bytes``."""
    return HEADER_SIZE + Slab.footprint(HEADER_SIZE, slots, slot_bytes, 1)


def create_slab(segment: Segment, slots: int, slot_bytes: int) -> Slab:
    """Lay out a client's input slab in its new segment (the daemon, at start)."""
    return Slab.create(
        segment, HEADER_SIZE, slots=slots, slot_bytes=slot_bytes, max_owners=1, quota=slots
    )


def open_slab(segment: Segment) -> Slab:
    """The input slab in a client's input segment, as the daemon laid it out."""
    return Slab(segment, HEADER_SIZE)


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
