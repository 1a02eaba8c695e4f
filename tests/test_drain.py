"""``rte drain NAME``: a daemon-wide drain through the real command, real daemons and
clients in processes of their own. The drained daemon refuses new sessions and
tells each client to move its own; pool clients move them (no gap, no repeat,
the frames a never-moved twin's), then ``--stop`` stops it with no session
lost. A plain client cannot move: the drain times out naming its session. The
asyncio pool migrates and follows a drain the same way."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_harness import TESTS, DaemonProcess, Deadline

from rte.client import (
    AdmissionError,
    EngineClient,
    InProcessClient,
    NoticeKind,
    RequestError,
    connect_async,
    connect_pool,
)
from rte.composed import ComposedEngine
from rte.ipc.inspect import summary
from rte.models import load_model
from rte.protocol.names import DaemonNames

PACE_HZ = 30.0


@pytest.fixture
def pool(shm_prefix: str) -> Iterator[list[DaemonProcess]]:
    """Two paced daemons of the reference model, NAME-0 and NAME-1 (a pool found by
    name, as ``rte serve --name NAME --replicas 2`` runs them), four rows each."""
    started = [
        DaemonProcess(
            f"{shm_prefix}p-{i}",
            *("--model", "reference", "--max-sessions", "4", "--pace-hz", str(PACE_HZ)),
        )
        for i in range(2)
    ]
    for d in started:
        d.client().close()  # both up
    yield started
    for d in started:  # (one rte drain stopped: its exit code, its log closed)
        assert d.stop() == 0, d.stderr
        DaemonNames(d.name).remove_leftovers()


def rte_drain(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rte", "drain", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def twin(sessions: dict[str, int]) -> dict[str, dict[int, Any]]:
    """The frames of sessions never moved (until each one's chunk), in this process."""
    got: dict[str, dict[int, Any]] = {s: {} for s in sessions}
    with InProcessClient(ComposedEngine(load_model("reference", max_sessions=4))) as alone:
        for session in sessions:
            alone.attach(session, {"prompt": "forest"})
        limit = Deadline(what="the twin's frames")
        while any(sessions[s] not in got[s] for s in sessions):
            limit.check()
            chunk = alone.poll(timeout=1.0)
            if chunk is not None:
                with chunk:
                    got[chunk.session][chunk.chunk] = chunk.latent.copy()
    return got


def record(client: EngineClient, frames: dict[str, dict[int, Any]], timeout: float = 0.2) -> None:
    """One poll's chunk into ``frames`` (a repeat fails the test)."""
    chunk = client.poll(timeout=timeout)
    if chunk is None:
        return
    with chunk:
        seen = frames.setdefault(chunk.session, {})
        assert chunk.chunk not in seen, f"{chunk.session}: chunk {chunk.chunk} came twice"
        seen[chunk.chunk] = chunk.latent.copy()


def no_gap_twins_frames(frames: dict[int, Any], same: dict[int, Any], session: str) -> None:
    assert sorted(frames) == list(range(len(frames))), f"{session}: a gap in its chunks"
    for index, frame in frames.items():
        np.testing.assert_array_equal(frame, same[index], err_msg=f"{session} chunk {index}")


def test_rte_drain_moves_two_pool_clients_sessions_then_stops_the_daemon(
    pool: list[DaemonProcess], tmp_path: Path
) -> None:
    """Two pool clients, two processes, sessions on both daemons: ``rte drain
    NAME-0 --stop`` ends with every session on NAME-1, each stream going on with
    no gap or repeat, its frames the twin's, the DRAINING notice saying where it
    went; then NAME-0 is stopped, no session lost."""
    drained, other = pool
    names = [d.name for d in pool]
    stop, out = tmp_path / "stop", tmp_path / "worker.json"
    spec = {"names": names, "sessions": ["b1", "b2"], "on": drained.name}
    spec |= {"stop": str(stop), "out": str(out)}
    worker = subprocess.Popen(
        [sys.executable, str(TESTS / "drain_worker.py"), json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        ready = json.loads(worker.stdout.readline())["ready"]
        assert drained.name in ready.values(), ready
        frames: dict[str, dict[int, Any]] = {}
        notices: list[Any] = []
        with connect_pool(names, timeout=30) as client:
            for session in ("a1", "a2"):
                client.attach(session, {"prompt": "forest"})
            if all(client.home[s] != drained.name for s in ("a1", "a2")):
                client.migrate("a1", to=drained.name)
            mine = {s for s in ("a1", "a2") if client.home[s] == drained.name}
            limit = Deadline(what="the sessions' first chunks")
            while any(len(frames.get(s, {})) < 5 for s in ("a1", "a2")):
                limit.check()
                record(client, frames)
            drain = rte_drain(drained.name, "--timeout", "15", "--stop")
            limit = Deadline(what="rte drain")
            while drain.poll() is None:  # the client streams, and moves at its polls
                limit.check()
                record(client, frames)
                notices += client.notices()
            said, err = drain.communicate()
            assert drain.returncode == 0, err
            assert all(client.home[s] == other.name for s in ("a1", "a2"))
            assert f"{drained.name} drained: " in said and "stopped" in said, said
            for _ in range(20):  # they go on there
                record(client, frames)
            notices += client.notices()
        moved = {n.session: n.message for n in notices if n.kind is NoticeKind.DRAINING}
        assert set(moved) == mine and all(f"moved to {other.name!r}" in m for m in moved.values())
        assert drained.process.wait(10) == 0  # stopped by rte drain (cleanly)
        stop.touch()
        assert worker.wait(30) == 0
    finally:
        stop.touch()
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        if worker.stdout is not None:
            worker.stdout.close()
    found = json.loads(out.read_text())
    assert not found["repeats"], found["repeats"]
    assert set(found["homes"].values()) == {other.name}, found["homes"]
    theirs = [n for n in found["notices"] if n[1] == "DRAINING"]
    assert theirs and all(f"moved to {other.name!r}" in n[2] for n in theirs), theirs
    last = {s: max(f) for s, f in frames.items()} | {
        s: max(int(i) for i in f) for s, f in found["frames"].items()
    }
    same = twin(last)
    for session in ("a1", "a2"):
        no_gap_twins_frames(frames[session], same[session], session)
    for session, hashes in found["frames"].items():
        got = {int(i): h for i, h in hashes.items()}
        assert sorted(got) == list(range(len(got))), f"{session}: a gap in its chunks"
        for index, digest in got.items():
            expected = hashlib.sha256(same[session][index].tobytes()).hexdigest()
            assert digest == expected, f"{session} chunk {index}"


def test_a_plain_clients_session_stays_the_drain_times_out_naming_it(
    pool: list[DaemonProcess],
) -> None:
    """A plain client cannot move: it sees the DRAINING notice, ``rte drain`` exits 1
    naming its session and client; meanwhile the draining daemon refuses new
    sessions (saying so), a pool's new session lands on the other daemon, and
    ``rte inspect`` shows the drain."""
    drained, other = pool
    with drained.client() as plain, drained.client() as late:
        plain.attach("solo")
        drain = rte_drain(drained.name, "--timeout", "3")
        limit = Deadline(what="the daemon's drain")
        while summary(drained.name).get("draining_s") is None:
            limit.check()
            record(plain, {})
        with pytest.raises(AdmissionError, match="is draining"):
            late.attach("newcomer")
        with connect_pool([d.name for d in pool], timeout=30) as client:
            client.attach("pooled")
            assert client.home["pooled"] == other.name
        listing = subprocess.run(
            [sys.executable, "-m", "rte", "inspect"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert any(
            drained.name in line and "draining" in line for line in listing.stdout.split("\n")
        )
        shown = subprocess.run(
            [sys.executable, "-m", "rte", "inspect", drained.name],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "draining for " in shown.stdout.splitlines()[0], shown.stdout + shown.stderr
        while drain.poll() is None:
            limit.check()
            record(plain, {})
        said, err = drain.communicate()
        told = [n for n in plain.notices() if n.kind is NoticeKind.DRAINING]
        assert plain.sessions == {"solo"}
    assert drain.returncode == 1, (said, err)
    assert "'solo' (client " in err and "still there" in err and len(err.splitlines()) == 1, err
    assert told and told[0].session == "solo" and "draining" in told[0].message
    again = subprocess.run(  # draining already (it never stops): said so, the same wait
        [sys.executable, "-m", "rte", "drain", drained.name, "--timeout", "5"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and "draining already" in again.stdout, again


def test_rte_drain_says_what_is_wrong_in_one_line(
    pool: list[DaemonProcess], shm_prefix: str
) -> None:
    for args, words in (
        ([f"{shm_prefix}ghost"], "no daemon named"),
        ([f"{shm_prefix}p"], "is a pool of 2 daemons"),
        ([pool[0].name, "--timeout", "-1"], "not a number of seconds"),
        ([pool[0].name, "--timeout", "nan"], "not a number of seconds"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "rte", "drain", *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode in (1, 2) and words in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert summary(pool[0].name)["draining_s"] is None  # none of them drained it


def test_an_asyncio_pool_migrates_and_follows_a_drain(
    pool: list[DaemonProcess], shm_prefix: str
) -> None:
    """The asyncio client over a pool: ``migrate`` and ``drain`` move a session with
    no gap, and ``rte drain`` of its daemon moves it at its next poll, its notice
    saying where; a plain asyncio client has nowhere to move to."""
    frames: dict[int, Any] = {}
    notices: list[Any] = []

    async def poll_into(client: Any) -> None:
        chunk = await client.poll(timeout=0.2)
        if chunk is not None:
            with chunk:
                assert chunk.chunk not in frames, f"chunk {chunk.chunk} came twice"
                frames[chunk.chunk] = chunk.latent.copy()

    async def main() -> None:
        async with connect_async(f"{shm_prefix}p", timeout=30) as client:
            await client.attach("a", {"prompt": "forest"})
            homes = client.transport.home  # type: ignore[attr-defined]
            first = homes["a"]
            second = next(d.name for d in pool if d.name != first)
            limit = Deadline(what="the session's chunks")
            while len(frames) < 5:
                limit.check()
                await poll_into(client)
            assert await client.migrate("a", to=second) == second
            while len(frames) < 10:
                limit.check()
                await poll_into(client)
            assert await client.drain(second) == {"a": first}  # this client's own drain
            while len(frames) < 15:
                limit.check()
                await poll_into(client)
            drain = await asyncio.create_subprocess_exec(  # then the daemon-wide one
                sys.executable,
                "-m",
                "rte",
                "drain",
                first,
                "--timeout",
                "10",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            while drain.returncode is None:
                limit.check()
                await poll_into(client)
                notices.extend(client.notices())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(drain.wait(), 0.01)
            _, err = await drain.communicate()
            assert drain.returncode == 0, err
            assert homes["a"] == second
            end = len(frames) + 10
            while len(frames) < end:
                limit.check()
                await poll_into(client)
            notices.extend(client.notices())
            moved = [n for n in notices if n.kind is NoticeKind.DRAINING]
            assert len(moved) == 1 and f"moved to {second!r}" in moved[0].message, moved
        async with connect_async(pool[0].name, timeout=30) as plain:
            with pytest.raises(RequestError, match="not a pool"):
                await plain.migrate("a", to=pool[1].name)

    asyncio.run(asyncio.wait_for(main(), 60))
    same = twin({"a": max(frames)})["a"]
    no_gap_twins_frames(frames, same, "a")


def test_a_drained_session_with_nowhere_to_go_stays_then_moves_once_there_is_room(
    pool: list[DaemonProcess],
) -> None:
    """The other daemon full, a drained session's move is refused: it goes back
    where it was (the draining daemon takes its own session back with its state,
    never lost), its client is told once, and the move is tried again: once
    there is room it moves, the drain ends, no gap, the twin's frames."""
    drained, other = pool
    frames: dict[str, dict[int, Any]] = {}
    notices: list[Any] = []
    with other.client() as filler:
        for i in range(4):  # every row of the other daemon
            filler.attach(f"f{i}")
        with connect_pool([d.name for d in pool], timeout=30) as client:
            client.attach("a", {"prompt": "forest"})
            assert client.home["a"] == drained.name

            def stream() -> None:
                record(client, frames, 0.05)
                while (chunk := filler.poll(timeout=0.0)) is not None:
                    chunk.release()
                notices.extend(client.notices())

            limit = Deadline(what="the drain's refused move")
            while len(frames.get("a", {})) < 3:
                limit.check()
                stream()
            drain = rte_drain(drained.name, "--timeout", "15")
            while not any("could not move" in n.message for n in notices):
                limit.check(notices)
                stream()
            assert client.home["a"] == drained.name and client.sessions == {"a"}
            filler.detach("f0")  # room, at last
            while drain.poll() is None:
                limit.check(notices)
                stream()
            _, err = drain.communicate()
            assert drain.returncode == 0, err
            assert client.home["a"] == other.name
            for _ in range(10):
                stream()
    told = [n.message for n in notices if n.session == "a"]
    assert len(told) == 2 and told[-1].endswith(f"moved to {other.name!r}"), told
    no_gap_twins_frames(frames["a"], twin({"a": max(frames["a"])})["a"], "a")
