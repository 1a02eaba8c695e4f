"""The serve loop's queues: what an inbox and an outbox are, and how a turn
drains one and fills the other (steps 1 and 4 of :mod:`rte.serve`).

The loop never knows what the queues are: anything with ``get(timeout=)``
(raising ``queue.Empty``) and ``get_nowait()`` is an inbox, anything with
``put(item)`` an outbox; an outbox that also has ``put_many`` takes each
call's items whole (a step's chunks are then one batch for its consumer).
"""

from __future__ import annotations

import queue
from typing import Any, Protocol

from rte.delivery import OutboxItem


class Inbox(Protocol):
    def get(self, block: bool = True, timeout: float | None = None) -> Any: ...

    def get_nowait(self) -> Any: ...


class Outbox(Protocol):
    def put(self, item: Any) -> None: ...


def put_all(outbox: Outbox, items: list[OutboxItem]) -> None:
    """Everything one call produced; an outbox with ``put_many`` takes it whole
    (a step's chunks are then one batch for its consumer)."""
    if not items:
        return
    put_many = getattr(outbox, "put_many", None)
    if put_many is not None:
        put_many(items)
        return
    for item in items:
        outbox.put(item)


def drain(inbox: Inbox, *, block: bool, timeout: float) -> list[Any]:
    """Every message waiting in ``inbox``; with ``block``, wait up to ``timeout``
    for the first (none came: an empty list)."""
    messages = []
    if block:
        try:
            messages.append(inbox.get(timeout=timeout))
        except queue.Empty:
            return messages
    while True:
        try:
            messages.append(inbox.get_nowait())
        except queue.Empty:
            return messages
