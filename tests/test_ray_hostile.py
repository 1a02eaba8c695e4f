"""A session's state moving in through Ray's object store, lost on the way: the
host's relay (:mod:`rte.ray.relay`) answers the caller's attach with an ERROR
for its seq saying so, rather than an exception in a remote call nobody
awaits (the caller then waited its whole timeout for an answer that never
came). A real one-node Ray cluster, a real daemon, an object whose owner died."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from daemon_harness import DaemonProcess

from rte.contract import NoticeKind
from rte.protocol.requests import STATE_KEY, Attach
from rte.ray.cluster import local_cluster

ray = pytest.importorskip("ray", reason="the ray extra (in the dev extra): pip install -e '.[ray]'")


@pytest.fixture(scope="module")
def one_node() -> Iterator[Any]:
    with local_cluster([{}]) as cluster:
        yield cluster


def test_a_state_lost_in_the_object_store_is_an_error_for_its_attach(
    one_node: Any, shm_prefix: str
) -> None:
    from rte.ray.relay import Relay, StoredState  # noqa: PLC0415 (after Ray's environment)

    @ray.remote
    class Putter:
        def put(self) -> list[Any]:
            return [ray.put(b"a state's bytes")]  # (in a list: handed over unfetched)

    putter = Putter.remote()  # type: ignore[attr-defined]
    (ref,) = ray.get(putter.put.remote(), timeout=60)
    ray.kill(putter)  # its owner is gone: the object cannot be fetched any more
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
