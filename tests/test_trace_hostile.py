"""Traces attacked on purpose: a garbled trace given to ``rte replay`` is one line
naming its line, never a hang, a traceback or a terabyte allocation; a trace
file never replaces another one (an earlier run's, or a session whose name
maps to the same file), and a session name too long for a file still gets
its trace. Real recordings of a real in-process client, replayed for real."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess

from rte.cli import main
from rte.client import connect
from rte.composed import ComposedEngine
from rte.models import load_model
from rte.play.traces import TraceFiles
from rte.recorder import Recorder
from rte.replay import replay_engine
from rte.trace import MAX_CHUNK_GAP, TraceError, read_trace

Records = list[dict[str, Any]]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Records:
    """A reference session's trace (an action at chunk 2), as its lines."""
    out = tmp_path_factory.mktemp("good") / "good.jsonl"
    with connect(model="reference", max_sessions=2) as client, Recorder(client, out) as rec:
        rec.attach("bob", {"prompt": "snow"}, credits=1)
        for chunk in rec.results(timeout=5.0):
            with chunk:
                if chunk.chunk == 2:
                    rec.act("bob", {"prompt": "rain"})
            if chunk.chunk == 6:
                break
    return [json.loads(line) for line in out.read_text().splitlines()]


def _last_chunk(r: Records) -> None:
    [x for x in r if x["kind"] == "chunk"][-1]["index"] = 10**12


def _identity(r: Records) -> None:
    r[0]["model"]["identity"] = "abc"


def _rows_text(r: Records) -> None:
    r[0]["manifest"]["max_sessions"] = "x"


def _rows_huge(r: Records) -> None:
    r[0]["manifest"]["max_sessions"] = 10**9


def _kind_huge(r: Records) -> None:
    r.insert(2, {"kind": "x" * 100_000})


def _t_nan(r: Records) -> None:
    r[2]["t"] = "nan"


def _priority(r: Records) -> None:
    r[1]["priority"] = 99


@pytest.mark.parametrize(
    ("garble", "number", "words"),
    [
        (_last_chunk, 10, "a gap of 999999999994 chunks"),  # (replayed ~forever)
        (_identity, 1, "model identity is not one"),  # (AttributeError: "a bug")
        (_rows_text, 1, "max_sessions"),  # ("invalid literal for int()", nothing else)
        (_rows_huge, 1, "max_sessions"),  # (MemoryError: 3.73 TiB)
        (_kind_huge, 3, "a line of kind 'xxxx"),  # (a 100 KB line)
        (_t_nan, 3, "t is nan"),  # (replayed: "nanx the trace's pace")
        (_priority, 2, "priority"),
    ],
)
def test_a_garbled_trace_is_one_line_naming_its_line(
    good: Records,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    garble: Callable[[Records], None],
    number: int,
    words: str,
) -> None:
    records = json.loads(json.dumps(good))
    garble(records)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(TraceError, match=f"line {number}: .*{words}"):
        read_trace(bad)
    assert main(["replay", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rte replay: {bad} line {number}: ") and "\n" not in err, err
    assert len(err) < 400 and "a bug" not in err, err


def test_a_trace_nested_too_deep_is_refused_not_a_recursion_error(
    good: Records, tmp_path: Path
) -> None:
    bad = tmp_path / "deep.jsonl"
    lines = [json.dumps(r) for r in good[:2]]
    deep = '{"kind": "act", "seq": 1, "chunk": 0, "t": 0, "conditioning": ' + "[" * 100_000
    bad.write_text("\n".join([*lines, deep]) + "\n")
    with pytest.raises(TraceError, match="line 3: JSON nested too deep"):
        read_trace(bad)


def test_a_trace_with_a_gap_a_recorder_leaves_still_replays(good: Records, tmp_path: Path) -> None:
    """The bound refuses garbage, not a trace missing a few chunks (ones its
    client never saw): those are made again and not compared."""
    records = [r for r in good if r.get("kind") != "chunk" or r["index"] not in (2, 3)]
    gap = tmp_path / "gap.jsonl"
    gap.write_text("".join(json.dumps(r) + "\n" for r in records))
    trace = read_trace(gap)
    assert [c.index for c in trace.chunks][:3] == [0, 1, 4] and MAX_CHUNK_GAP >= 1024
    engine = ComposedEngine(load_model(trace.model, max_sessions=2))
    try:
        assert replay_engine(trace, engine).identical
    finally:
        engine.close()


def test_trace_files_never_replace_a_file_and_take_any_session_name(tmp_path: Path) -> None:
    """Sessions named 'a/b' and 'a_b' map to one file name, 'keep' to a file an
    earlier run left, and a 256-byte name is longer than a file name may be:
    each gets a trace of its own, in the directory, that replays identically,
    and the earlier file is as it was (before: replaced, or no trace at all)."""
    earlier = tmp_path / "keep.trace.jsonl"
    earlier.write_text("an earlier run's trace\n")
    names = ["a/b", "a_b", "keep", "../up", "L" * 256]
    files = TraceFiles(tmp_path)
    seen: dict[str, int] = {}
    with (
        connect(model="reference", max_sessions=len(names)) as client,
        Recorder(client, files) as rec,
    ):
        for name in names:
            rec.attach(name, {"prompt": "snow"}, credits=1)
        for chunk in rec.results(timeout=5.0):
            with chunk:
                seen[chunk.session] = seen.get(chunk.session, 0) + 1
            if len(seen) == len(names) and min(seen.values()) >= 4:
                break
    assert earlier.read_text() == "an earlier run's trace\n"
    traces = sorted(p for p in tmp_path.iterdir() if p != earlier)
    assert len(traces) == len(names), [p.name for p in traces]
    assert all(p.parent == tmp_path for p in traces)
    sessions = set()
    for path in traces:
        trace = read_trace(path)
        sessions.add(trace.session)
        engine = ComposedEngine(load_model(trace.model, max_sessions=2))
        try:
            assert replay_engine(trace, engine).identical, path
        finally:
            engine.close()
    assert sessions == set(names)


def test_rte_record_to_a_full_disk_fails_saying_the_trace_is_cut(
    shm_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rte record``'s one job is its trace: when it cannot be written (ENOSPC, a
    real device that fails every write) the command exits 1 saying so, rather
    than "recorded 5 chunks ... to /dev/full" and 0 with nothing on disk."""
    daemon = DaemonProcess(shm_prefix, "--model", "reference", "--max-sessions", "2")
    try:
        daemon.wait_ready(60)
        args = ["record", "--name", shm_prefix, "--session", "s", "--chunks", "5"]
        assert main([*args, "--out", "/dev/full"]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("rte record: the trace of 's' to /dev/full stopped after"), err
        assert "No space left" in err and "\n" not in err, err
    finally:
        assert daemon.stop() == 0, daemon.stderr
