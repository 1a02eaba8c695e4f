"""A pool of daemons as one client: admission by free rows, sticky sessions, and a
daemon's death lost by its own sessions alone (real processes, real kills)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from daemon_harness import DaemonProcess, Deadline, serving

from rte.client import AdmissionError, EngineGone, PoolClient, connect, connect_async, connect_pool
from rte.contract import NoticeKind
from rte.models.null import tag_of
from rte.protocol.names import DaemonNames

ROWS = 2


@pytest.fixture
def daemons(shm_prefix: str) -> Iterator[list[DaemonProcess]]:
    args = ("--model", "null", "--max-sessions", str(ROWS))
    with serving(*(DaemonProcess(f"{shm_prefix}p-{i}", *args) for i in range(2))) as started:
        yield started


def stream(client: PoolClient, want: dict[str, int], seconds: float = 20) -> dict[str, list]:
    """Chunks (index, tag) per session until each in ``want`` has that many."""
    got: dict[str, list] = {s: [] for s in want}
    limit = Deadline(seconds, what=f"chunks of {sorted(want)}")
    while any(len(got[s]) < n for s, n in want.items()):
        limit.check({s: len(v) for s, v in got.items()})
        batch = client.poll_batch(timeout=1.0)
        if batch is None:
            continue
        with batch:
            for i, session in enumerate(batch.sessions):
                got.setdefault(session, []).append((int(batch.chunks[i]), tag_of(batch.latents[i])))
    return got


def test_sessions_spread_by_free_rows_stay_home_and_a_full_pool_refuses(
    daemons: list[DaemonProcess], shm_prefix: str
) -> None:
    for d in daemons:
        d.client().close()  # both up
    with connect(f"{shm_prefix}p", timeout=30) as found:  # NAME-* found as a pool
        assert isinstance(found, PoolClient)
        assert sorted(found.members) == [d.name for d in daemons]
    with connect_pool([d.name for d in daemons], timeout=30) as client:
        for i in range(2 * ROWS):
            client.attach(f"s{i}")
        homes = [client.home[f"s{i}"] for i in range(2 * ROWS)]
        assert sorted(homes) == sorted([d.name for d in daemons] * ROWS)  # spread evenly
        assert homes[0] != homes[1]  # each to the one with more room
        with pytest.raises(AdmissionError, match="no daemon of the pool took it"):
            client.attach("one-too-many")
        for i in range(2 * ROWS):
            client.act(f"s{i}", {"tag": 10 + i})
        got = stream(client, {f"s{i}": 12 for i in range(2 * ROWS)})
        for i in range(2 * ROWS):  # every action reached its session's daemon
            chunks = got[f"s{i}"]
            assert chunks[-1][1] == 10 + i
            assert [c for c, _ in chunks] == list(range(chunks[0][0], chunks[0][0] + len(chunks)))
        client.detach("s0")
        client.attach("again")  # the row s0 left is the only one: it goes there
        assert client.home["again"] == homes[0]


def test_a_killed_daemon_loses_its_own_sessions_only(daemons: list[DaemonProcess]) -> None:
    with connect_pool([d.name for d in daemons], timeout=30) as client:
        for name in ("a", "b"):
            client.attach(name)
        doomed = next(d for d in daemons if d.name == client.home["b"])
        survivor = "a"
        before = stream(client, {survivor: 4, "b": 4})
        doomed.kill()
        lost: list[str] = []
        limit = Deadline(what="the lost session's notice")
        while not lost:
            limit.check()
            batch = client.poll_batch(timeout=0.5)
            if batch is not None:
                with batch:  # the survivor streams on meanwhile: keep its chunks
                    rows = zip(batch.chunks, batch.sessions, strict=True)
                    before[survivor] += [(int(c), 0) for c, s in rows if s == survivor]
            lost += [n.message for n in client.notices() if n.kind is NoticeKind.ERROR]
        assert "EngineGone" in lost[0] and doomed.name in lost[0]
        assert client.sessions == {survivor}
        with pytest.raises(EngineGone, match=doomed.name):
            client.act("b", {"tag": 1})
        after = stream(client, {survivor: 20})[survivor]
        seen = [c for c, _ in before[survivor]] + [c for c, _ in after]
        assert seen == list(range(seen[0], seen[0] + len(seen)))  # no gap on the survivor


def test_reattach_moves_a_dead_daemons_sessions_with_their_conditioning(
    daemons: list[DaemonProcess],
) -> None:
    with connect_pool([d.name for d in daemons], timeout=30, reattach=True) as client:
        client.attach("a")
        client.attach("b")
        client.act("b", {"tag": 42})
        stream(client, {"a": 3, "b": 3})
        doomed = next(d for d in daemons if d.name == client.home["b"])
        doomed.kill()
        limit = Deadline(what="b attached again elsewhere")
        while client.home.get("b") in (None, doomed.name) or "b" not in client.sessions:
            limit.check(client.home)
            batch = client.poll_batch(timeout=0.5)
            if batch is not None:
                batch.release()
        notices = client.notices()
        assert any(n.kind is NoticeKind.ERROR and n.session == "b" for n in notices)
        again = stream(client, {"b": 3})["b"]
        assert again[0][0] == 0 and again[-1][1] == 42  # from chunk 0, as it was steered


def test_a_pool_with_a_daemon_down_serves_on_the_others_and_takes_it_back(
    daemons: list[DaemonProcess], shm_prefix: str
) -> None:
    """A replica down (a supervisor restarting it) does not stop the pool being made;
    it joins again at the next attach once it is up; a pool whose daemons are all
    gone says so instead of spinning; a large frame goes by slot to its daemon."""
    for d in daemons:
        d.client().close()
    daemons[1].kill()
    DaemonNames(daemons[1].name).remove_leftovers()
    with connect_pool([d.name for d in daemons], timeout=1) as client:
        assert client.live() == [daemons[0].name] and client.missing == [daemons[1].name]
        client.attach("a")
        again = DaemonProcess(daemons[1].name, "--model", "null", "--max-sessions", str(ROWS))
        daemons[1] = again
        again.client().close()
        client.attach("b")  # the returned daemon has the most free rows
        assert client.home["b"] == again.name and client.missing == []
        frame = {"frame": np.zeros((512, 512, 3), np.uint8)}  # too big for a record
        client.act("b", frame)  # null takes any key: it travelled by slot
        daemons[0].kill()
        again.kill()
        with pytest.raises(EngineGone, match="every daemon of pool"):
            limit = Deadline(what="EngineGone from a pool with nobody left")
            while True:
                limit.check()
                batch = client.poll_batch(timeout=0.5)
                if batch is not None:
                    batch.release()


def test_an_asyncio_pool_found_by_name_spreads_and_loses_a_dead_daemons_sessions_only(
    daemons: list[DaemonProcess], shm_prefix: str
) -> None:
    """connect_async("NAME") is the pool of NAME-* (it said no daemon was named
    NAME): one loop waits on both daemons' descriptors, and a killed one costs
    its own session alone, told as a notice, while the other streams on."""
    for d in daemons:
        d.client().close()  # both up

    async def main() -> None:
        async with connect_async(f"{shm_prefix}p", timeout=30) as client:
            await client.attach("a")
            await client.attach("b")
            homes = client.transport.home  # type: ignore[attr-defined]
            assert {homes["a"], homes["b"]} == {d.name for d in daemons}
            doomed = next(d for d in daemons if d.name == homes["b"])
            seen: dict[str, list[int]] = {"a": [], "b": []}
            lost: list[str] = []
            limit = Deadline(what="the lost session's notice and the survivor's stream")
            while not lost or len(seen["a"]) < 20:
                limit.check({s: len(v) for s, v in seen.items()})
                if len(seen["b"]) >= 3 and doomed.process.poll() is None:
                    doomed.kill()
                batch = await client.poll_batch(timeout=0.5)
                if batch is not None:
                    with batch:
                        for session, chunk in zip(batch.sessions, batch.chunks, strict=True):
                            seen[session].append(int(chunk))
                lost += [n.message for n in client.notices() if n.kind is NoticeKind.ERROR]
            assert "EngineGone" in lost[0] and doomed.name in lost[0]
            assert client.sessions == {"a"}
            with pytest.raises(EngineGone, match=doomed.name):
                await client.act("b", {"tag": 1})
            assert seen["a"] == list(range(len(seen["a"])))  # no gap on the survivor

    asyncio.run(asyncio.wait_for(main(), 60))
