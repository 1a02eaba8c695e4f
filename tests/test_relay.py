"""A host's :class:`~rte.ray.relay.Relay` driven as its actor drives it (``send`` and
``stream`` on one event loop, ``give_back`` between), on a real daemon, without a
Ray cluster: what a caller on another node gets when the relay has no room."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from daemon_harness import DaemonProcess, Deadline

from rte.client.inputs import InputLoan
from rte.contract import Action, Notice, NoticeKind
from rte.errors import RequestTimeout
from rte.protocol.requests import Act, Attach
from rte.ray.relay import Message, Relay, Step


def test_an_act_that_finds_every_input_slot_held_waits_for_one_and_applies(
    shm_prefix: str,
) -> None:
    """The relay lent a remote caller's frame into an input slot once, at once: an
    act that came while the slots were all still held (the frames it replaces are
    read until a step later) was refused with a RequestTimeout, and its action lost
    (in CI, a remote session never showed a dark frame it was sent). It now waits
    for a slot, up to the caller's timeout, as a caller's own act on the daemon's
    node does, and the frame shows."""
    daemon = DaemonProcess(shm_prefix, "--model", "reference", "--max-sessions", "1")
    try:
        daemon.wait_ready(60)
        relay = Relay(daemon.name)
        try:
            asyncio.run(asyncio.wait_for(_held_up_act(relay), 60))
        finally:
            relay.close()
    finally:
        assert daemon.stop() == 0, daemon.stderr


async def _held_up_act(relay: Relay) -> None:
    stream = relay.stream()
    await relay.send(Attach("s", {}, seq=1), 1.0)
    await _until(stream, relay, lambda item: _kind(item) is NoticeKind.ATTACHED, "ATTACHED")
    h, w, _ = relay.manifest.latent_shape
    shape = (8 * h, 8 * w, 3)
    held: list[InputLoan] = []
    try:
        while True:  # every input slot of the relay's client held, none sent
            held.append(relay.transport.loan(shape, np.uint8, 0.0))
    except RequestTimeout:
        assert held, "the daemon lent no input slot at all"
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, held.pop().abort)  # one comes free while the act waits
    frame = np.zeros(shape, np.uint8)
    await relay.send(Act("s", Action({"frame": frame}), seq=2), 2.0)

    def dark(item: Any) -> bool:
        if _kind(item) in (NoticeKind.ERROR, NoticeKind.REJECTED):
            raise AssertionError(f"the act was refused: {item}")
        return isinstance(item, Step) and bool(item.applied.max() >= 2)

    (step,) = await _until(stream, relay, dark, "a chunk that applied the act")
    assert int(step.latents.max()) <= 127, "the chunk that applied it shows no dark frame"
    for loan in held:
        loan.abort()


async def _until(stream: AsyncIterator[Message], relay: Relay, wanted: Any, what: str) -> list[Any]:
    """The stream read until an item is ``wanted`` (those items); every step given back."""
    limit = Deadline(30, what=what)
    while True:
        limit.check()
        message = await asyncio.wait_for(anext(stream), 30)
        relay.give_back(
            [
                (item.ident, np.arange(len(item.sessions)))
                for item in message
                if isinstance(item, Step)
            ]
        )
        found = [item for item in message if wanted(item)]
        if found:
            return found


def _kind(item: Any) -> NoticeKind | None:
    return item.kind if isinstance(item, Notice) else None
