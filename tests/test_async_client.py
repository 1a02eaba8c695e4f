"""What only the asyncio client shows: many connections on one loop, woken
through their descriptors, idle at almost no cost, and a dead daemon noticed
at once. (Its behaviour as a client is test_client.py's, run on it.)"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest
from daemon_harness import DaemonProcess, Deadline

import rte.client.loop_wait
from rte import ComposedEngine
from rte.client import AsyncClient, ClientClosedError, EngineGone, InProcessClient, connect_async
from rte.models import load_model
from rte.models.null import tag_of
from rte.protocol.names import DaemonNames
from shm import SegmentExistsError
from shm.fifo import FifoBell
from shm.names import objects, shm_name, unlink_objects

CONNECTIONS, PER = 8, 8  # 64 sessions on one loop


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    d = DaemonProcess(
        f"{shm_prefix}d",
        *("--model", "null", "--max-sessions", str(CONNECTIONS * PER)),
        *("--max-clients", str(CONNECTIONS + 1)),
    )
    yield d
    assert d.stop() == 0, d.stderr


def run(coroutine: object, timeout: float = 60.0) -> object:
    async def bounded() -> object:
        return await asyncio.wait_for(coroutine, timeout)  # type: ignore[arg-type]

    return asyncio.run(bounded())


async def connect_all(name: str) -> list[AsyncClient]:
    return list(await asyncio.gather(*(connect_async(name, 30) for _ in range(CONNECTIONS))))


def test_one_loop_serves_many_connections_woken_only_by_their_descriptors(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the liveness timer out of the way (an hour), every wake-up is the
    daemon ringing a client's FIFO: were it ringing the semaphore, nothing
    would arrive. Meanwhile other tasks act on the same clients."""
    monkeypatch.setattr(rte.client.loop_wait, "CHECK_EVERY_S", 3600.0)

    async def main() -> None:
        clients = await connect_all(daemon.name)
        try:
            for i, client in enumerate(clients):
                for j in range(PER):
                    await client.attach(f"c{i}s{j}")

            async def read(client: AsyncClient) -> dict[str, list[int]]:
                seen: dict[str, list[int]] = {s: [] for s in client.sessions}
                tags: dict[str, int] = {}
                while min(len(v) for v in seen.values()) < 6 or set(tags.values()) != {7}:
                    batch = await client.poll_batch(timeout=20)
                    assert batch is not None, f"{client.sessions} starved: {seen}"
                    with batch:
                        for k, session in enumerate(batch.sessions):
                            seen[session].append(int(batch.chunks[k]))
                            tags[session] = tag_of(batch.latents[k])
                return seen

            async def steer(client: AsyncClient) -> None:
                for session in sorted(client.sessions):
                    await client.act(session, {"tag": 7})
                    await asyncio.sleep(0)

            readers = [asyncio.ensure_future(read(c)) for c in clients]
            await asyncio.gather(*(steer(c) for c in clients))
            for client, seen in zip(clients, await asyncio.gather(*readers), strict=True):
                assert set(seen) == client.sessions
                for chunks in seen.values():
                    assert chunks == list(range(chunks[0], chunks[0] + len(chunks)))
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    run(main())


def test_an_idle_loop_of_8_connections_and_64_sessions_costs_almost_nothing(
    daemon: DaemonProcess,
) -> None:
    """Every session has used its credits (chunks held, not released): nothing
    can come. The loop waits on 8 descriptors for 5 s; its CPU time over that
    span must be well under 5% of a core (it wakes 4 times a second per
    connection, to check the daemon lives)."""

    async def main() -> float:
        clients = await connect_all(daemon.name)
        try:
            held = []
            for i, client in enumerate(clients):
                for j in range(PER):
                    await client.attach(f"c{i}s{j}", credits=1)
            for client in clients:  # one chunk per session: their credit is used
                got = 0
                while got < PER:
                    batch = await client.poll_batch(timeout=20)
                    assert batch is not None
                    held.append(batch)
                    got += len(batch)
            start_cpu, start = time.process_time(), time.monotonic()
            waits = [c.poll_batch(timeout=5.0) for c in clients]
            assert await asyncio.gather(*waits) == [None] * CONNECTIONS
            cpu = (time.process_time() - start_cpu) / (time.monotonic() - start)
            for batch in held:
                batch.release()
            return cpu
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    share = run(main())
    print(f"\nidle asyncio client, 8 connections / 64 sessions: {100 * share:.2f}% of a core")
    assert isinstance(share, float) and share < 0.05


def test_a_killed_daemon_wakes_every_waiting_task_with_engine_gone(shm_prefix: str) -> None:
    d = DaemonProcess(f"{shm_prefix}k", "--model", "null", "--max-sessions", "4")

    async def main() -> list[float]:
        client = await connect_async(d.name, 30)
        await client.attach("a", credits=1)
        batch = await client.poll_batch(timeout=20)
        assert batch is not None  # held: nothing more comes, the tasks sleep

        async def wait() -> float:
            start = time.monotonic()
            with pytest.raises(EngineGone, match=r"died|closed its end|stopping"):
                await client.poll(timeout=30)
            return time.monotonic() - start

        waits = [asyncio.ensure_future(wait()) for _ in range(3)]
        await asyncio.sleep(0.3)
        d.kill()
        took = list(await asyncio.gather(*waits))
        await client.close()
        return took

    try:
        took = run(main())
        assert max(took) < 10  # not the 30 s the poll was willing to wait
    finally:
        DaemonNames(d.name).remove_leftovers()


def test_close_ends_other_tasks_waits_and_gives_everything_back(daemon: DaemonProcess) -> None:
    async def main() -> None:
        client = await connect_async(daemon.name, 30)
        await client.attach("a", credits=1)
        held = await client.poll_batch(timeout=20)
        assert held is not None
        waiting = asyncio.ensure_future(client.poll(timeout=30))
        await asyncio.sleep(0.1)
        await client.close()
        with pytest.raises(ClientClosedError):
            await waiting
        with pytest.raises(ClientClosedError):
            await client.attach("b")
        held.release()  # after close: no harm
        async with connect_async(daemon.name, 30) as again:  # its rows and slots came back
            for i in range(CONNECTIONS * PER):
                await again.attach(f"s{i}")
            assert await again.poll_batch(timeout=20) is not None
        assert again.closed

    run(main())


def test_the_in_process_form_on_a_loop() -> None:
    async def main() -> None:
        async with connect_async(model="null", max_sessions=2) as client:
            await client.attach("a")
            await client.act("a", {"tag": 3})
            tags = []
            async for chunk in client.results(timeout=10):
                with chunk:
                    tags.append(tag_of(chunk.latent))
                if tags[-1] == 3:
                    break
            assert tags[-1] == 3 and client.held() == 0

    run(main())


def test_a_fifo_bell_rings_drains_and_reads_the_end_of_its_producer(shm_prefix: str) -> None:
    name = shm_name(shm_prefix, "w0")
    producer = FifoBell(name, create=True)
    try:
        with pytest.raises(SegmentExistsError):
            FifoBell(name, create=True)
        consumer = FifoBell(name)
        assert not consumer.wait(0.01)
        for _ in range(100_000):  # past the pipe's capacity: dropped, never blocks
            producer.ring()
        assert consumer.wait(1.0) and not consumer.wait(0.01)  # drained
        assert objects(name) == [name]
        producer.close()
        assert consumer.drain() is False  # no writer left: the producer is gone
        consumer.close()
    finally:
        producer.close()
        producer.unlink()
    assert not objects(name)
    assert not os.path.exists(f"/dev/shm/{name[1:]}")
    assert unlink_objects(name) == []


def test_an_announced_sleep_before_the_descriptor_exists_never_ends_the_serve_thread() -> None:
    """In process: a sleep announced before the eventfd was made, then a step put
    out: the serve thread must not write to a descriptor that is not there."""
    client = InProcessClient(ComposedEngine(load_model("null", max_sessions=1)))
    try:
        client.attach("a")
        limit = Deadline(what="an empty outbox to announce a sleep on")
        while client.transport.arm():  # something came: take it, try again
            limit.check()
            client.transport.disarm()
            batch = client.poll_batch(timeout=0)
            if batch is not None:
                batch.release()
        time.sleep(0.2)  # the serve thread steps and puts meanwhile
        assert client.transport.thread.is_alive(), client.transport.failure
        assert client.poll(timeout=5) is not None
    finally:
        client.close()
