"""Bystanders lose nothing, through a real daemon: a client whose sessions'
prompts make the model's encode or seed fail, in a loop, has those sessions
detached with an ERROR saying why; another client's session gets every chunk."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from daemon_harness import DaemonProcess, Deadline, leftovers, take
from poison_model import POISON

from rte import NoticeKind
from rte.client import EngineClient
from rte.contract import Notice

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    d = DaemonProcess(
        shm_prefix,
        "--model", "poison_model:poisoned",
        "--max-sessions", "4", "--max-clients", "4", "--slab-slots", "32",
    )  # fmt: skip
    yield d
    assert d.stop() == 0, d.stderr
    assert leftovers(shm_prefix) == []


def _until_detached(client: EngineClient, session: str) -> list[Notice]:
    """The notices about ``session`` until its DETACHED (its chunks released meanwhile)."""
    seen: list[Notice] = []
    deadline = Deadline(20, f"the detach of {session!r}")
    while not any(n.kind is NoticeKind.DETACHED for n in seen):
        deadline.check(seen)
        chunk = client.poll(timeout=0.2)
        if chunk is not None:
            chunk.release()
        seen += [n for n in client.notices() if n.session == session]
    return seen


def test_a_client_failing_its_own_sessions_in_a_loop_costs_a_bystander_nothing(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as bystander, daemon.client() as attacker:
        bystander.attach("steady")
        stream = [c.chunk for c in take(bystander, "steady", 3)]
        for n in range(3):
            attacker.attach(f"bad-{n}", {"prompt": "fine"})
            attacker.act(f"bad-{n}", {"prompt": POISON})  # its encode fails
            notices = _until_detached(attacker, f"bad-{n}")
            assert [k.kind for k in notices] == [NoticeKind.ERROR, NoticeKind.DETACHED]
            assert "encode failed" in notices[0].message and "PoisonFailure" in notices[0].message
            assert f"bad-{n}" not in attacker.sessions
            stream += [c.chunk for c in take(bystander, "steady", 2)]
        attacker.attach("bad-seed", {"prompt": POISON})  # admitted; its seed then fails
        notices = _until_detached(attacker, "bad-seed")
        assert "seed failed" in notices[0].message
        attacker.attach("bad-seed", {"prompt": "fine"})  # the id is free again
        stream += [c.chunk for c in take(bystander, "steady", 5)]
        assert stream == list(range(len(stream)))  # every chunk, in order: no gap, no repeat
        assert [c.chunk for c in take(attacker, "bad-seed", 2)] == [0, 1]
