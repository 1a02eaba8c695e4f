"""A pool reattaches a killed member's sessions from its last checkpoint (real
processes, a real SIGKILL, the checkpoint read from the dead daemon's segment), and
they go on as a twin never interrupted would."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from daemon_harness import DaemonProcess, Deadline, serving
from test_daemon_parking import twin_frames

from rte.client import PoolClient, connect_pool
from rte.contract import NoticeKind
from rte.ipc.checkpoints import read_checkpoint

EVERY = 3  # --checkpoint-every K
ARGS = ("--model", "world", "--max-sessions", "2", "--checkpoint-every", str(EVERY))


@pytest.fixture
def daemons(shm_prefix: str) -> Iterator[list[DaemonProcess]]:
    with serving(*(DaemonProcess(f"{shm_prefix}m-{i}", *ARGS) for i in range(2))) as started:
        yield started


def poll_into(client: PoolClient, frames: dict[int, Any]) -> None:
    """Session ``a``'s next frame (if one comes) into ``frames`` by chunk index."""
    chunk = client.poll(timeout=0.5)
    if chunk is not None:
        with chunk:
            if chunk.session == "a":
                frames[chunk.chunk] = np.array(chunk.latent)


def frames_of(client: PoolClient, frames: dict[int, Any], until: int) -> None:
    limit = Deadline(30, what=f"chunk {until} of a")
    while until not in frames:
        limit.check(sorted(frames))
        poll_into(client, frames)


def test_a_killed_members_session_resumes_from_its_checkpoint_on_the_survivor(
    daemons: list[DaemonProcess],
) -> None:
    """SIGKILL of the member streaming ``a``: the pool reads its checkpoint and moves
    ``a`` to the other with that state; it goes on from the checkpoint's chunk (at
    most K plus those in flight before its last), not from 0, told so, and every
    frame is the twin's."""
    names = [d.name for d in daemons]
    with connect_pool(names, timeout=30, reattach=True, recover=read_checkpoint) as client:
        client.attach("a", {})
        frames: dict[int, Any] = {}
        frames_of(client, frames, 9)
        doomed = next(d for d in daemons if d.name == client.home["a"])
        doomed.kill()
        limit = Deadline(what="a reattached on the survivor")
        while client.home.get("a") in (None, doomed.name):
            limit.check(client.home)
            poll_into(client, frames)  # what the dead one sent before it died
        notices = client.notices()
        told = [n for n in notices if n.kind is NoticeKind.ATTACHED and n.session == "a"]
        assert told and "from its last checkpoint" in told[-1].message, notices
        resumed_at, last = int(told[-1].message.rsplit(" ", 1)[-1]), max(frames)
        assert resumed_at > 0, "it went back to chunk 0"
        assert abs(last + 1 - resumed_at) <= EVERY + 3  # made again, or lost: <= K + credits
        after: dict[int, Any] = {}
        frames_of(client, after, resumed_at + 5)
        assert min(after) >= resumed_at  # (its first may have come with the ATTACHED)
        seen = {**frames, **after}
        assert set(range(resumed_at, resumed_at + 6)) <= set(seen), sorted(seen)
        twin = twin_frames(resumed_at + 6)
        for index, frame in seen.items():
            np.testing.assert_array_equal(frame, twin[index], err_msg=f"chunk {index}")
