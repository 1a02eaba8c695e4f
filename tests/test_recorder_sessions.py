"""A recorder of every session: each its own trace, a reset the next, a full disk its own.

A :class:`rte.recorder.Recorder` whose ``out`` is a function of the session's
name (as ``rte play --record-traces`` uses its asyncio twin) on a real
in-process client of the trained ``world`` model: three sessions batched,
one traced to a file, one to ``/dev/full`` (every write fails: ENOSPC), one
not at all; a reset ends the first's trace and begins its next life's; each
trace replays identically, and the full disk stopped its trace alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rte.client import connect
from rte.composed import ComposedEngine
from rte.errors import RequestError
from rte.models import load_model
from rte.recorder import Recorder
from rte.replay import replay_engine
from rte.trace import read_trace

FULL = Path("/dev/full")  # a real device whose every write fails with ENOSPC


def replayed(path: Path) -> Any:
    trace = read_trace(path)
    engine = ComposedEngine(load_model(trace.model, max_sessions=trace.manifest["max_sessions"]))
    try:
        return trace, replay_engine(trace, engine)
    finally:
        engine.close()


def test_each_session_its_own_trace_a_reset_the_next_and_a_full_disk_its_own(
    tmp_path: Path,
) -> None:
    lives: dict[str, int] = {}

    def where(session: str) -> Path | None:
        lives[session] = lives.get(session, 0) + 1
        if session == "cy":
            return None  # not recorded
        return FULL if session == "bob" else tmp_path / f"{session}-{lives[session]}.jsonl"

    taken: dict[str, list[int]] = {"ann": [], "bob": [], "cy": []}
    life2: list[int] = []  # ann's chunks after its reset
    with connect(model="world", max_sessions=3) as client, Recorder(client, where) as rec:
        for name in taken:
            rec.attach(name, {"prompt": "snow"}, credits=1)
        reset = False
        for chunk in rec.results(timeout=5.0):
            with chunk:
                taken[chunk.session].append(chunk.chunk)
                if chunk.session != "bob" and chunk.chunk < 6:
                    rec.act(chunk.session, {"move": (chunk.chunk % 3 - 1, 1)})
            if chunk.session == "ann" and chunk.chunk == 8 and not reset:
                rec.reset("ann")  # its trace ends; its next life's begins
                reset = True
            if reset and chunk.session == "ann" and (life2 or chunk.chunk == 0):
                life2.append(chunk.chunk)  # (the first life's last may come after the reset)
            if len(life2) >= 8:
                break
        bob = rec.end("bob")
        rec.detach("ann")
    assert bob is not None and bob.error is not None and "No space left" in bob.error
    assert taken["bob"] == list(range(len(taken["bob"]))) and len(taken["bob"]) > 9  # streamed on
    assert sorted(lives) == ["ann", "bob", "cy"] and lives["ann"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ann-1.jsonl", "ann-2.jsonl"]

    first, result = replayed(tmp_path / "ann-1.jsonl")
    assert [c.index for c in first.chunks] == list(range(9)) and first.seconds is not None
    assert result.identical and result.chunks == 9
    second, result = replayed(tmp_path / "ann-2.jsonl")
    assert second.chunks[0].index == 0 and second.seconds is not None
    assert second.conditioning == {"prompt": "snow", "move": first.acts[-1].conditioning["move"]}
    assert any(a.chunk is not None for a in second.acts)
    assert result.identical and result.chunks == len(second.chunks) >= 8
    assert [c.index for c in second.chunks] == life2 == list(range(len(life2)))


def test_a_recorder_of_one_file_refuses_a_reset_of_its_session(tmp_path: Path) -> None:
    with (
        connect(model="world", max_sessions=2) as client,
        Recorder(client, tmp_path / "one.jsonl") as rec,
    ):
        rec.attach("ann", credits=1)
        with pytest.raises(RequestError, match="a trace holds no reset"):
            rec.reset("ann")
        rec.attach("bob", credits=1)
        rec.reset("bob")  # not the recorded one: passed on
