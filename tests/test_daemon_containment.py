"""Bystanders lose nothing, through a real daemon (and in process): a client
whose sessions' prompts make the model's encode or seed fail, in a loop, has
those sessions detached with an ERROR saying why; another client's session
gets every chunk."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from daemon_harness import DaemonProcess, Deadline, leftovers
from poison_model import POISON, PoisonModel

from rte import ComposedEngine, NoticeKind
from rte.client import EngineClient, InProcessClient
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


def test_a_client_failing_its_own_sessions_in_a_loop_costs_a_bystander_nothing(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as bystander, daemon.client() as attacker:
        _fail_in_a_loop(bystander, attacker)


def test_in_process_a_session_failing_in_a_loop_costs_a_bystander_nothing() -> None:
    engine = ComposedEngine(PoisonModel(4))
    with InProcessClient(engine) as client:  # one client, both roles: the same loop
        _fail_in_a_loop(client, client)
    engine.close()


class _Watch:
    """Every chunk index and notice the clients are sent, by session (chunks released)."""

    def __init__(self) -> None:
        self.chunks: dict[str, list[int]] = {}
        self.notices: dict[str, list[Notice]] = {}

    def pump(self, client: EngineClient, until: Callable[[], bool], what: str) -> None:
        deadline = Deadline(20, what)
        while not until():
            deadline.check(self.chunks)
            chunk = client.poll(timeout=0.2)
            if chunk is not None:
                with chunk:
                    self.chunks.setdefault(chunk.session, []).append(chunk.chunk)
            for notice in client.notices():
                self.notices.setdefault(notice.session, []).append(notice)

    def more(self, client: EngineClient, session: str, n: int) -> None:
        have = len(self.chunks.get(session, []))
        self.pump(client, lambda: len(self.chunks.get(session, [])) >= have + n, session)

    def detached(self, client: EngineClient, session: str) -> list[NoticeKind]:
        def gone() -> bool:
            return any(n.kind is NoticeKind.DETACHED for n in self.notices.get(session, []))

        self.pump(client, gone, f"the detach of {session!r}")
        return [n.kind for n in self.notices[session]]


def _fail_in_a_loop(bystander: EngineClient, attacker: EngineClient) -> None:
    watch = _Watch()
    bystander.attach("steady")
    watch.more(bystander, "steady", 3)
    for n in range(3):
        attacker.attach(f"bad-{n}", {"prompt": "fine"})
        attacker.act(f"bad-{n}", {"prompt": POISON})  # its encode fails
        assert watch.detached(attacker, f"bad-{n}") == [NoticeKind.ERROR, NoticeKind.DETACHED]
        error = watch.notices[f"bad-{n}"][0].message
        assert "encode failed" in error and "PoisonFailure" in error
        assert f"bad-{n}" not in attacker.sessions
        watch.more(bystander, "steady", 2)
    attacker.attach("bad-seed", {"prompt": POISON})  # admitted; its seed then fails
    assert watch.detached(attacker, "bad-seed") == [NoticeKind.ERROR, NoticeKind.DETACHED]
    assert "seed failed" in watch.notices["bad-seed"][0].message
    attacker.attach("bad-seed", {"prompt": "fine"})  # the id is free again
    watch.more(attacker, "bad-seed", 2)
    watch.more(bystander, "steady", 5)
    steady = watch.chunks["steady"]
    assert steady == list(range(len(steady)))  # every chunk, in order: no gap, no repeat
    assert watch.chunks["bad-seed"][:2] == [0, 1]


def test_a_session_the_step_fails_gives_back_its_frame_slot_and_its_place_at_once(
    daemon: DaemonProcess,
) -> None:
    """Its input slot and the client's session count are given back when the step
    detaches it, not when the client's last session leaves."""
    from daemon_harness import wait_for  # noqa: PLC0415

    from rte.ipc.inspect import snapshot  # noqa: PLC0415

    with daemon.client() as client:
        h, w, _ = client.manifest.latent_shape
        client.attach("steady")
        with client.loan((4 * h, 4 * w, 3), "uint8") as frame:  # lent through a slot
            frame[...] = 7
            client.attach("doomed", {"prompt": "fine", "frame": frame})
        held = lambda: sum(snapshot(daemon.name)["inputs"]["held_by_client"].values())  # noqa: E731
        assert held() == 1
        client.act("doomed", {"prompt": POISON})  # its encode fails: the step detaches it
        deadline = Deadline(20, "the doomed session's detach")
        while not any(n.kind is NoticeKind.DETACHED for n in client.notices()):
            batch = client.poll_batch(timeout=0.05)
            if batch is not None:
                batch.release()
            deadline.check()
        wait_for(lambda: held() == 0, what="the frame's slot given back")
        entry = next(c for c in snapshot(daemon.name)["clients"] if c["state"] == "active")
        assert entry["sessions"] == 1  # "steady" alone
