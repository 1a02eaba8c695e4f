"""Record and replay: a session's trace made again, bit for bit, or the chunk that differs.

A real daemon of the trained ``world`` model, driven by ``rte record`` (moves
and a prompt change), replayed by ``rte replay`` in this process and through
the daemon; a trace tampered with (another model, an action changed or moved)
diverges at the chunk it should; a garbled trace is refused naming its line;
the recorders on an in-process client, sync and asyncio.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_harness import DaemonProcess

from rte.cli import main
from rte.client import connect, connect_async
from rte.composed import ComposedEngine
from rte.models import load_model
from rte.recorder import AsyncRecorder, Recorder
from rte.replay import replay_engine
from rte.trace import TraceError, decode_value, encode_value, read_trace

CHUNKS = 24
MOVES = "R,R,R,D,D,D,L,L,U,U,S,R"
PROMPT_AT = 13  # after this chunk the prompt changes


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A world session of a real daemon, recorded by ``rte record``; its daemon's name."""
    from shm.names import shm_name, unlink_objects  # noqa: PLC0415 (needs posix_ipc)

    name = f"t{os.getpid()}x{uuid.uuid4().hex[:10]}trace"  # the suite's prefix: leaks are seen
    daemon = DaemonProcess(name, "--model", "world", "--max-sessions", "2")
    out = tmp_path_factory.mktemp("trace") / "walk.jsonl"
    try:
        daemon.wait_ready(60)
        args = ["record", "--name", name, "--session", "alice", "--prompt", "a forest"]
        args += ["--chunks", str(CHUNKS), "--out", str(out), "--moves", MOVES]
        args += ["--prompt-at", f"{PROMPT_AT}:a desert at night", "--device", "cpu"]
        assert main(args) == 0
        yield out, name
    finally:
        if daemon.process.poll() is None:
            daemon.stop()
        left = unlink_objects(shm_name(name))
    assert not left, f"the daemon left shared memory behind: {left}"


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_recorded_daemon_session_replays_identically_in_process(
    recorded: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = recorded
    trace = read_trace(path)
    assert trace.header["device"] == "cpu"  # rte record --device: replayed there by default
    assert [c.index for c in trace.chunks] == list(range(CHUNKS))
    landed = [a.chunk for a in trace.acts]
    assert all(c is not None for c in landed) and landed == sorted(landed)  # type: ignore[type-var]
    assert any("prompt" in a.conditioning for a in trace.acts)
    assert trace.acts[0].conditioning == {"move": (0, 1)}  # a tuple, as it was sent
    capsys.readouterr()
    assert main(["replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"identical, {CHUNKS} chunks" in out
    assert "chunks/s flat out" in out and "the trace's pace" in out


def test_a_recorded_session_replays_identically_through_the_daemon(
    recorded: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, name = recorded
    assert main(["replay", str(path), "--name", name]) == 0
    assert f"identical, {CHUNKS} chunks" in capsys.readouterr().out


def test_another_model_diverges_at_the_first_chunk(
    recorded: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = recorded
    assert main(["replay", str(path), "--model", "reference"]) == 1
    out = capsys.readouterr().out
    first = read_trace(path).chunks[0].blake2b
    assert f"diverged at chunk 0: trace {first}, replay " in out


def test_a_tampered_action_diverges_at_the_chunk_it_applied_at(
    recorded: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = recorded
    records = lines(path)
    act = next(r for r in records if r["kind"] == "act" and r["chunk"] >= 6)
    act["conditioning"] = {"move": {"$tuple": [0, -1]}}  # the opposite way, from that chunk
    assert main(["replay", str(write(tmp_path / "t.jsonl", records))]) == 1
    out = capsys.readouterr().out
    assert f"diverged at chunk {act['chunk']}: trace " in out
    assert f"({act['chunk']} chunks identical before it" in out


def test_an_action_moved_a_chunk_later_diverges_where_it_was(
    recorded: tuple[Path, str], tmp_path: Path
) -> None:
    path, _ = recorded
    records = lines(path)
    act = next(r for r in records if r["kind"] == "act" and r["chunk"] >= 6)
    was = act["chunk"]
    act["chunk"] = was + 1
    result = replay_engine(read_trace(write(tmp_path / "t.jsonl", records)), world_engine())
    assert result.divergence is not None
    assert result.divergence.index == was
    assert result.chunks == was


def world_engine() -> ComposedEngine:
    return ComposedEngine(load_model("world", max_sessions=2))


@pytest.mark.parametrize(
    ("line", "text", "number"),
    [
        ("{not json", "not JSON", 3),
        ('["a", "list"]', "not an object", 3),
        ('{"kind": "chunk", "index": 0}', "field missing", 3),
        ('{"kind": "frame"}', "of kind 'frame'", 3),
        ('{"kind": "act", "seq": 1, "chunk": -4, "conditioning": {}, "t": 0}', "index or null", 3),
        (
            '{"kind": "act", "seq": 1, "chunk": 2, "conditioning": {"$array": 1}, "t": 0}',
            "[$]array",
            3,
        ),
    ],
)
def test_a_garbled_trace_is_refused_naming_its_line(
    recorded: tuple[Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    line: str,
    text: str,
    number: int,
) -> None:
    good = recorded[0].read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([*good[: number - 1], line, *good[number - 1 :]]) + "\n")
    with pytest.raises(TraceError, match=f"line {number}: .*{text}"):
        read_trace(bad)
    assert main(["replay", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rte replay: {bad} line {number}: ") and "\n" not in err


def test_a_trace_cut_mid_line_or_from_a_newer_rte_is_refused(
    recorded: tuple[Path, str], tmp_path: Path
) -> None:
    text = recorded[0].read_text()
    cut = tmp_path / "cut.jsonl"
    kept = text.splitlines()[:10]
    cut.write_text("\n".join([*kept[:9], kept[9][: len(kept[9]) // 2]]))  # a crash mid-line
    count = 10
    with pytest.raises(TraceError, match=f"line {count}: not JSON"):
        read_trace(cut)
    records = lines(recorded[0])
    records[0]["version"] = 99
    with pytest.raises(TraceError, match=r"line 1: a trace of version 99.*upgrade rte"):
        read_trace(write(tmp_path / "new.jsonl", records))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TraceError, match="empty, not a trace"):
        read_trace(tmp_path / "empty.jsonl")
    with pytest.raises(TraceError, match="line 1: not a trace"):
        read_trace(write(tmp_path / "other.jsonl", records[1:]))


def test_conditioning_values_come_back_as_they_were_sent() -> None:
    value = {
        "prompt": "a forest",
        "move": (1, -1),
        "frame": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        "raw": b"\x00\xff",
        "odd": [float("nan"), float("inf"), np.int64(3)],
        "keys": {1: "one", "$x": "dollar"},
    }
    back = decode_value(json.loads(json.dumps(encode_value(value), allow_nan=False)))
    assert back["move"] == (1, -1) and isinstance(back["move"], tuple)
    assert back["frame"].dtype == np.float32 and np.array_equal(back["frame"], value["frame"])
    assert back["raw"] == b"\x00\xff" and back["keys"] == {1: "one", "$x": "dollar"}
    assert np.isnan(back["odd"][0]) and back["odd"][1:] == [float("inf"), 3]
    with pytest.raises(TraceError, match="type object cannot be written"):
        encode_value({"x": object()})


def test_the_recorder_on_an_in_process_client_records_refusals_and_replays(tmp_path: Path) -> None:
    out = tmp_path / "in.jsonl"
    with connect(model="world", max_sessions=2) as client, Recorder(client, out) as rec:
        rec.attach("bob", {"prompt": "snow"}, credits=1)
        for chunk in rec.results(timeout=5.0):
            with chunk:
                if chunk.chunk == 3:
                    rec.act("bob", {"move": "sideways"})  # refused by the model
                elif chunk.chunk < 10:
                    rec.act("bob", {"move": (chunk.chunk % 3 - 1, 1)})
            if chunk.chunk == 12:
                break
    trace = read_trace(out)
    refused = [a for a in trace.acts if a.refused is not None]
    assert len(refused) == 1 and "move" in refused[0].refused and refused[0].chunk is None
    assert replay_engine(trace, world_engine()).identical


def test_the_asyncio_recorder_records_a_session_that_replays(tmp_path: Path) -> None:
    out = tmp_path / "async.jsonl"

    async def record() -> None:
        async with (
            connect_async(model="world", max_sessions=2) as client,
            AsyncRecorder(client, out, session="carol") as rec,
        ):
            await rec.attach("dave", credits=1)  # not recorded: another session
            await rec.attach("carol", {"prompt": "ocean islands"}, credits=1)
            async for chunk in rec.results(timeout=5.0):
                with chunk:
                    if chunk.session == "carol" and chunk.chunk < 8:
                        await rec.act("carol", {"move": (1, chunk.chunk % 2)})
                    if chunk.session == "carol" and chunk.chunk == 10:
                        break

    asyncio.run(asyncio.wait_for(record(), 60))
    trace = read_trace(out)
    assert trace.session == "carol" and len(trace.chunks) == 11
    result = replay_engine(trace, world_engine())
    assert result.identical and result.chunks == 11
