"""A session's state moving in through Ray's object store, lost on the way: the
host's relay (:mod:`rte.ray.relay`) answers the caller's attach with an ERROR
for its seq saying so, rather than an exception in a remote call nobody
awaits (the caller then waited its whole timeout for an answer that never
came). A real two-node Ray cluster, a real daemon, an object whose owner died;
and an export answered too late, its state pinned in the store (not fixed here)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from daemon_harness import DaemonProcess, Deadline, wait_for

from rte.contract import NoticeKind
from rte.protocol.requests import STATE_KEY, Attach
from rte.ray.cluster import local_cluster

ray = pytest.importorskip("ray", reason="the ray extra (in the dev extra): pip install -e '.[ray]'")


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Any]:
    """A head (this driver's node) and a worker, the only node with an rte_gpu: a
    host started there is elsewhere, its sessions through the relay."""
    with local_cluster([{}, {"rte_gpu": 1}]) as cluster:
        yield cluster


def test_a_state_lost_in_the_object_store_is_an_error_for_its_attach(
    two_nodes: Any, shm_prefix: str
) -> None:
    from rte.ray.relay import Relay, StoredState  # noqa: PLC0415 (after Ray's environment)

    @ray.remote
    class Putter:
        def put(self) -> list[Any]:
            return [ray.put(b"a state's bytes")]  # (in a list: handed over unfetched)

    putter = Putter.remote()  # type: ignore[attr-defined]
    (ref,) = ray.get(putter.put.remote(), timeout=60)
    ray.kill(putter)  # its owner is gone: the object cannot be fetched any more
    limit = Deadline(60, what="the putter actor dead")  # (a kill is not synchronous: the
    while True:  # state was fetched whole when its owner had not died yet, once in CI)
        limit.check()
        try:
            ray.get(putter.put.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            break
        except ray.exceptions.GetTimeoutError:
            continue
    lost = Deadline(60, what="the state lost once its owner died")  # (the raylet frees a
    while True:  # dead owner's objects in its own time: in CI the attach once found it whole)
        lost.check()
        try:
            ray.get(ref, timeout=10)
        except ray.exceptions.GetTimeoutError:
            continue
        except ray.exceptions.RayError:
            break
        time.sleep(0.2)
    daemon = DaemonProcess(shm_prefix, "--model", "reference", "--max-sessions", "2")
    try:
        daemon.wait_ready(60)
        relay = Relay(daemon.name)
        try:
            attach = Attach("moved", {STATE_KEY: StoredState(ref)}, seq=5)
            asyncio.run(asyncio.wait_for(relay.send(attach, 1.0), 60))
            (answer,) = relay._early
            assert answer.kind is NoticeKind.ERROR and answer.seq == 5, answer
            assert "could not be fetched from Ray's object store" in answer.message, answer
        finally:
            relay.close()
    finally:
        assert daemon.stop() == 0, daemon.stderr


def test_a_late_export_answer_pins_nothing_in_the_object_store(
    two_nodes: Any, shm_prefix: str
) -> None:
    """An export answered after its call timed out left its state's ObjectRef in
    RemoteMember.states for good (export_done had looked for it before it came):
    pinned in the object store, never fetched. Its ref is now dropped as it comes."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from rte.errors import RequestTimeout  # noqa: PLC0415
    from rte.ipc.inspect import summary  # noqa: PLC0415
    from rte.ray import RayClient, start_hosts  # noqa: PLC0415

    started, router = start_hosts(
        ["--model", "reference", "--max-sessions", "1"], 1, name=f"{shm_prefix}late"
    )
    try:
        with RayClient(router, started) as client:
            client.attach("a", {"prompt": "forest"})
            index = client.home["a"]
            daemon = client.places[index][0]
            member = client.transport.by_host.open[index]  # type: ignore[attr-defined]
            assert client.path("a") == "ray"
            member_states = member.states
            pid = summary(daemon)["pid"]
            os.kill(pid, signal.SIGSTOP)
            try:
                wait_for(lambda: _state_of(pid) == "T", what="the daemon stopped")
                with pytest.raises(RequestTimeout):
                    client.export("a", timeout=0.5)
            finally:
                os.kill(pid, signal.SIGCONT)
            for _ in range(30):  # its answer comes late, with the state's ref
                chunk = client.poll(timeout=0.1)
                if chunk is not None:
                    chunk.release()
            assert not member_states, f"refs left pinned: {member_states}"
    finally:
        ray.get([h.stop.remote() for h in started], timeout=60)
        for actor in [*started, router]:
            ray.kill(actor)


def _state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]
