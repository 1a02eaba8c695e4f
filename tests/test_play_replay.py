"""Record a browser session of ``rte play`` and replay it exactly (issue 25).

A real ``rte play --record-traces DIR`` of a real daemon of the trained
``world`` model, a real Chromium tab (test_play's fixtures) steered by real
key presses, the server stopped by Ctrl-C with the tab still open; then the
real ``rte replay`` (a child process) makes every chunk of the tab's trace
again, bit for bit, and a trace whose action was changed diverges at the chunk
that action applied at. A tab's Reset ends its trace and begins its next
life's, a tab that closes while the server runs has its trace ended then, and
SIGTERM ends the traces of the tabs still open, as the daemon's death does:
each replays identically.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from daemon_harness import DaemonProcess
from test_play import (  # the browser and daemon fixtures are test_play's own
    RIGHT,
    ROOT,
    Page,
    Play,
    RawTab,
    browser,  # noqa: F401
    daemon,  # noqa: F401
    in_browser,
)

from rte.protocol.names import DaemonNames
from rte.trace import Trace, read_trace

DOWN = {"key": "ArrowDown", "code": "ArrowDown", "windowsVirtualKeyCode": 40}
STILL = (0, 0)


@contextlib.contextmanager
def recording(of: DaemonProcess, traces: Path) -> Iterator[Play]:
    """``rte play --name`` of that daemon, its WebSocket transport, recording traces;
    stopped after the block, which must have left no Traceback in what it said."""
    play = Play(
        "--name", of.name, "--wait", "30", "--transport", "websocket",
        "--record-traces", str(traces),
    )  # fmt: skip
    try:
        yield play
    finally:
        play.stop()
    assert "Traceback" not in play.said(), play.said()


def over_http(body: Callable[[aiohttp.ClientSession], Awaitable[None]]) -> None:
    """``body`` with an HTTP client (30 s a request), failing after 60 s."""

    async def main() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            await body(http)

    asyncio.run(asyncio.wait_for(main(), 60))


def trace_of(traces: Path, session: str) -> Path:
    return traces / f"{session}.trace.jsonl"


def replay(path: Path) -> subprocess.CompletedProcess[str]:
    """``rte replay PATH`` in a child process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "rte", "replay", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def replays_identically(path: Path, trace: Trace) -> None:
    """``rte replay`` of ``path`` makes each of the chunks of ``trace`` again."""
    done = replay(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"identical, {len(trace.chunks)} chunks" in done.stdout, done.stdout


def applied_moves(trace: Trace) -> list[tuple[int, Any]]:
    """(chunk, move) of each action that applied at a chunk."""
    return [(a.chunk, a.conditioning.get("move")) for a in trace.acts if a.chunk is not None]


async def ended(path: Path, timeout: float = 10.0) -> Trace:
    """The trace in ``path`` once its end line is written."""
    deadline = time.monotonic() + timeout
    while not (path.is_file() and '"kind":"end"' in path.read_text()):
        assert time.monotonic() < deadline, f"{path}: no end line in {timeout} s"
        await asyncio.sleep(0.05)
    return read_trace(path)


def test_a_browser_session_replays_identically_and_a_changed_action_where_it_applied(
    browser: str,  # noqa: F811
    daemon: DaemonProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    traces = tmp_path / "traces"
    sessions: list[str] = []
    with recording(daemon, traces) as play:

        async def body(http: aiohttp.ClientSession) -> None:
            page = await Page.open(http, browser, play.url)
            sessions.append(await page.until("rtePlay.session", "a session's name"))
            await page.until("rtePlay.fps > 0", "frames")
            await page.press(RIGHT, hold_s=0.6)  # right while held
            await asyncio.sleep(0.3)
            await page.press(DOWN, hold_s=0.4)
            await asyncio.sleep(0.3)
            await page.press(RIGHT)  # a tap: a step or two
            await asyncio.sleep(0.4)
            assert await asyncio.to_thread(play.stop, signal.SIGINT) == 130, play.said()
            await page.close()

        in_browser(browser, body)
    assert [p.name for p in traces.iterdir()] == [f"{sessions[0]}.trace.jsonl"]
    path = trace_of(traces, sessions[0])
    trace = read_trace(path)
    assert trace.seconds is not None, "no end line: the trace was not finished at Ctrl-C"
    assert trace.session == sessions[0] and trace.model == "world"
    indices = [c.index for c in trace.chunks]
    assert indices[0] == 0 and len(indices) >= 30, indices
    moves = applied_moves(trace)
    assert {(0, 1), (1, 0), STILL} <= {m for _, m in moves}, moves

    replays_identically(path, trace)

    # the first move that is the last action of its chunk, the other way
    records = [json.loads(line) for line in path.read_text().splitlines()]
    acts = [r for r in records if r["kind"] == "act" and r["chunk"] is not None]
    act = next(
        a
        for i, a in enumerate(acts)
        if a["conditioning"]["move"] == {"$tuple": [0, 1]}
        and all(b["chunk"] != a["chunk"] for b in acts[i + 1 :])
    )
    act["conditioning"] = {"move": {"$tuple": [0, -1]}}
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = replay(tampered)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"diverged at chunk {act['chunk']}: trace " in done.stdout, done.stdout
    assert f"({act['chunk']} chunks identical before it" in done.stdout, done.stdout


def test_a_reset_and_a_closed_tab_end_their_traces_and_sigterm_ends_the_rest(
    daemon: DaemonProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    traces = tmp_path / "traces"
    with recording(daemon, traces) as play:

        async def body(http: aiohttp.ClientSession) -> None:
            closing = await RawTab.open(http, play.url)
            staying = await RawTab.open(http, play.url)
            for tab, move in ((closing, [0, 1]), (staying, [1, 0])):
                await tab.ws.send_str(json.dumps({"move": move, "seq": 1}))
                await tab.streams("after a move")
            name = closing.of("hello")[0]["session"]
            await closing.ws.send_str('{"reset": true, "seq": 2}')  # its next life's trace
            trace = await ended(trace_of(traces, name))
            assert trace.chunks and applied_moves(trace)[0][1] == (0, 1)
            await closing.streams("after the reset")
            await closing.close()  # its session detaches: its trace ends, play goes on
            after = await ended(trace_of(traces, f"{name}-2"))
            assert after.chunks[0].index == 0 and after.conditioning["move"] == (0, 1)
            await staying.streams("the tab still open")
            assert await asyncio.to_thread(play.stop, signal.SIGTERM) == 0, play.said()
            await staying.close()

        over_http(body)
    finished = [read_trace(path) for path in sorted(traces.iterdir())]
    assert len(finished) == 3 and all(t.seconds is not None for t in finished), finished
    for path, trace in zip(sorted(traces.iterdir()), finished, strict=True):
        replays_identically(path, trace)  # whole up to their end lines, as they were made


def test_a_killed_daemon_ends_the_traces_whole(
    daemon: DaemonProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    traces = tmp_path / "traces"
    try:
        with recording(daemon, traces) as play:

            async def body(http: aiohttp.ClientSession) -> None:
                tab = await RawTab.open(http, play.url)
                await tab.ws.send_str('{"move": [0, -1], "seq": 1}')
                await tab.streams("after a move")
                daemon.kill()
                await tab.until(lambda: tab.of("gone"), "the EngineGone message")
                await tab.close()

            over_http(body)
            assert play.wait(15) == 1, play.said()
    finally:
        DaemonNames(daemon.name).remove_leftovers()
    (path,) = traces.iterdir()
    trace = read_trace(path)
    assert trace.seconds is not None and trace.chunks, "not ended at the daemon's death"
    replays_identically(path, trace)
