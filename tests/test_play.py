"""``rte play`` in a real browser: headless Chromium from the distribution, driven
over the Chrome DevTools Protocol (a WebSocket per page, from aiohttp), against
a real ``rte play`` process and a real daemon of the trained ``world`` model,
whose frames are checked against the world it learned (:mod:`rte.models.worldgen`).

The browser comes from ``tools/install_browser.sh``; without it these tests
fail (they do not skip). It is started with every background service off and
a host resolver that resolves nothing, so it contacts nothing but 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import psutil
import pytest
from child_python import python_c
from daemon_harness import DaemonProcess, ended

from rte.ipc.inspect import summary
from rte.launch.childlog import child_log, said
from rte.models import worldgen
from rte.protocol.names import DaemonNames

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "tools/install_browser.sh"
CHROMIUM_FLAGS = [
    "--headless=new",
    "--remote-debugging-port=0",
    "--remote-debugging-address=127.0.0.1",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--metrics-recording-only",
    "--disable-breakpad",
    "--disable-features=Translate,OptimizationHints,MediaRouter",
    "--no-sandbox",
    "--disable-dev-shm-usage",  # its shared memory in /tmp, never in /dev/shm
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--mute-audio",
    "--hide-scrollbars",
    "--window-size=640,720",
]
SLIDE = -worldgen.SPEED  # a chunk of a move right: the scene slides left by this many px
BOUND = 6.0  # a trained frame's mean absolute error (of 255) to the world's truth, at most
RIGHT = {"key": "ArrowRight", "code": "ArrowRight", "windowsVirtualKeyCode": 39}
ENTER = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": "\r"}


def recorder(canvas: str) -> str:
    """JavaScript that installs a recorder of what ``canvas`` (an expression) shows
    at each frame, read back at the model's size, with the frame's chunk."""
    return f"""(() => {{
  window.__frames = [];
  rtePlay.onframe = (chunk) => {{
    if (__frames.length >= 400) return;
    const view = {canvas}, k = rtePlay.scale;
    const data = view.getContext("2d").getImageData(0, 0, view.width, view.height).data;
    let bytes = "";
    for (let y = 0; y < rtePlay.height; y++) {{
      for (let x = 0; x < rtePlay.width; x++) {{
        const i = ((y * k + (k >> 1)) * view.width + x * k + (k >> 1)) * 4;
        bytes += String.fromCharCode(data[i], data[i + 1], data[i + 2]);
      }}
    }}
    __frames.push([chunk, btoa(bytes)]);
  }};
  return true;
}})()"""


RECORD = recorder('document.getElementById("view")')  # what the page's canvas shows


# -- the browser ------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Headless Chromium; yields its DevTools address, http://127.0.0.1:PORT."""
    yield from chromium(CHROMIUM_FLAGS, tmp_path_factory.mktemp("chromium-profile"))


def chromium(flags: list[str], profile: Path) -> Iterator[str]:
    """Headless Chromium run with ``flags`` and its profile in ``profile`` (the
    browser fixtures of test_play and test_webrtc); yields its DevTools address,
    then fails if it contacted more than this machine, and stops it with its helpers."""
    found = shutil.which("chromium")
    if found is None:
        pytest.fail(f"no chromium on PATH: install it with `bash {INSTALL}` (as root)")
    log = child_log()  # closed below
    command = [found, *flags, f"--user-data-dir={profile}", "about:blank"]
    process = subprocess.Popen(  # a process group of its own: its helpers go with it
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not (
            listening := re.search(r"DevTools listening on ws://(127\.0\.0\.1:\d+)/", said(log))
        ):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"chromium did not start (exit {process.poll()}): {said(log)[-2000:]}")
            time.sleep(0.05)
        yield f"http://{listening.group(1)}"
        elsewhere = remote_peers(process.pid)
        assert not elsewhere, f"chromium contacted more than this machine: {elsewhere}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        with contextlib.suppress(ProcessLookupError):  # its renderers, GPU and zygote
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def remote_peers(pid: int) -> list[str]:
    """The peers of the open connections of process ``pid`` and its children that
    are not 127.0.0.1."""
    peers = []
    with contextlib.suppress(psutil.NoSuchProcess):
        browser = psutil.Process(pid)
        for process in [browser, *browser.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                for connection in process.net_connections(kind="inet"):
                    if connection.raddr and connection.raddr.ip != "127.0.0.1":
                        peers.append(f"{connection.raddr.ip}:{connection.raddr.port}")
    return peers


class Page:
    """One page target, spoken to over its own DevTools WebSocket."""

    record = RECORD  # what ``frames`` installs: a recorder of the page's canvas

    def __init__(self, http: aiohttp.ClientSession, devtools: str, target: dict[str, Any]):
        self.http, self.devtools, self.id = http, devtools, target["id"]
        self.url: str = target["webSocketDebuggerUrl"]
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self._next = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, devtools: str, url: str) -> Page:
        async with http.put(f"{devtools}/json/new?{url}") as response:
            target = await response.json()
        return await cls.attach(http, devtools, target)

    @classmethod
    async def attach(
        cls, http: aiohttp.ClientSession, devtools: str, target: dict[str, Any]
    ) -> Page:
        """The page of ``target`` (a DevTools target), once it has loaded ``rtePlay``."""
        page = cls(http, devtools, target)
        page.ws = await http.ws_connect(page.url, max_msg_size=0)
        page._reader = asyncio.create_task(page._read())
        await page.until("document.readyState === 'complete' && !!window.rtePlay", "the page")
        return page

    async def _read(self) -> None:
        assert self.ws is not None
        async for message in self.ws:
            data = json.loads(message.data)
            waiting = self._waiting.pop(data.get("id", -1), None)
            if waiting is not None and not waiting.done():
                waiting.set_result(data)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        assert self.ws is not None
        self._next += 1
        answer = self._waiting[self._next] = asyncio.get_running_loop().create_future()
        await self.ws.send_str(json.dumps({"id": self._next, "method": method, "params": params}))
        reply = await asyncio.wait_for(answer, 15)
        if "error" in reply:
            raise AssertionError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply["result"]
        return result

    async def eval(self, expression: str) -> Any:
        reply = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression!r} threw: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def until(self, expression: str, what: str, timeout: float = 10.0) -> Any:
        """The value of ``expression`` once it is truthy; fails after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not (value := await self.eval(expression)):
            if time.monotonic() > deadline:
                page = await self.eval("document.body.innerText")
                raise AssertionError(f"{what}: not within {timeout} s; the page says {page!r}")
            await asyncio.sleep(0.05)
        return value

    async def message(self, what: str) -> Any:
        """The text of the page's message, once it is shown; fails after 10 s."""
        return await self.until(
            "(() => { const m = document.getElementById('message');"
            " return !m.hidden && m.innerText; })()",
            what,
        )

    async def streams_on(self, what: str) -> None:
        """Until the page has shown 5 frames more than it has now."""
        count = await self.eval("rtePlay.frames")
        await self.until(f"rtePlay.frames > {count} + 5", what)

    async def press(self, key: dict[str, Any], hold_s: float = 0.03) -> None:
        await self.call("Input.dispatchKeyEvent", type="keyDown", **key)
        await asyncio.sleep(hold_s)
        await self.call("Input.dispatchKeyEvent", type="keyUp", **key)

    async def frames(self, seconds: float) -> list[tuple[int, np.ndarray[Any, Any]]]:
        """What the canvas showed, frame by frame, for ``seconds``: (chunk, (h, w, 3))."""
        await self.eval(self.record)
        await asyncio.sleep(seconds)
        return await self.recorded()

    async def recorded(self) -> list[tuple[int, np.ndarray[Any, Any]]]:
        got = await self.eval("(() => { rtePlay.onframe = null; return window.__frames; })()")
        height, width = await self.eval("[rtePlay.height, rtePlay.width]")
        return [
            (chunk, np.frombuffer(base64.b64decode(b), np.uint8).reshape(height, width, 3))
            for chunk, b in got
        ]

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.ws is not None:
            await self.ws.close()
        async with self.http.get(f"{self.devtools}/json/close/{self.id}") as response:
            await response.read()


# -- rte play ---------------------------------------------------------------------


class Play:
    """``python -m rte play --port 0 ARGS`` in a child process."""

    def __init__(self, *args: str) -> None:
        self._log = child_log()  # closed in stop
        self._said = ""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rte", "play", "--port", "0", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=ROOT,
        )
        assert self.process.stdout is not None
        ready, line = time.monotonic() + 60, b""
        while not line.endswith(b"\n"):
            left = ready - time.monotonic()
            if left <= 0 or not select.select([self.process.stdout], [], [], left)[0]:
                self.stop()
                raise AssertionError(f"rte play was not ready in time: {self.said()}")
            if not (byte := os.read(self.process.stdout.fileno(), 1)):
                self.stop()
                raise AssertionError(f"rte play exited: {self.said()}")
            line += byte
        self.ready = line.decode()
        found = re.search(r"open (http://127\.0\.0\.1:\d+/) \(daemon (\S+),", self.ready)
        assert found, self.ready
        self.url, self.daemon = found.group(1), found.group(2)

    def said(self) -> str:
        """What it wrote to stderr (all of it, once stopped)."""
        if not self._log.closed:
            self._said = said(self._log)
        return self._said

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"rte play did not exit: {self.said()}") from None

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.said()
        self._log.close()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    """A paced daemon of the trained world model, named from the test's prefix."""
    yield from world_daemon(f"{shm_prefix}play")


def world_daemon(name: str) -> Iterator[DaemonProcess]:
    """A paced daemon ``name`` of the trained world model (the daemon fixtures of
    test_play and test_webrtc), stopped after the test unless it has ended."""
    # admission by rows: these tests are of the browser path, and a loaded box can
    # measure the real-time capacity below the tabs they open (its own tests: test_realtime)
    args = ("--model", "world", "--pace-hz", "30", "--max-sessions", "4", "--admission", "rows")
    process = DaemonProcess(name, *args)
    yield process
    if process.process.poll() is None:
        process.stop()


@pytest.fixture
def play(daemon: DaemonProcess) -> Iterator[Play]:
    """``rte play --name`` of that daemon, its WebSocket fallback (WebRTC: test_webrtc)."""
    process = Play("--name", daemon.name, "--wait", "30", "--transport", "websocket")
    yield process
    process.stop()


def in_browser(devtools: str, body: Callable[[aiohttp.ClientSession], Awaitable[None]]) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            await asyncio.wait_for(body(http), 90)

    asyncio.run(main())


def best_shift(before: np.ndarray[Any, Any], after: np.ndarray[Any, Any], most: int = 8) -> int:
    """The horizontal shift (px, right positive) that best maps ``before`` on ``after``,
    compared where the two overlap."""
    a, b = before.astype(np.int16), after.astype(np.int16)
    width = a.shape[1]
    errors = [
        np.abs(a[:, max(0, -s) : width - max(0, s)] - b[:, max(0, s) : width - max(0, -s)]).mean()
        for s in range(-most, most + 1)
    ]
    return int(np.argmin(errors)) - most


def step_shifts(frames: list[tuple[int, np.ndarray[Any, Any]]]) -> list[int]:
    """The best shift between each pair of frames of consecutive chunks."""
    return [best_shift(a, b) for (i, a), (j, b) in itertools.pairwise(frames) if j == i + 1]


def truth_error(frame: np.ndarray[Any, Any], prompt: str, position: tuple[int, int]) -> float:
    """How far a frame is from the world the model learned, seen from ``position``."""
    return float(np.abs(frame.astype(np.float64) - worldgen.view(prompt, position)).mean())


def screenshot_path(tmp_path: Path) -> Path:
    return Path(os.environ.get("RTE_PLAY_SCREENSHOT") or tmp_path / "play.png")


# -- the tests --------------------------------------------------------------------


def test_frames_keys_prompt_and_refusals_in_the_page(
    browser: str, play: Play, tmp_path: Path
) -> None:
    async def body(http: aiohttp.ClientSession) -> None:
        page = await Page.open(http, browser, play.url)
        session = await page.until("rtePlay.session", "a session's name")
        await page.until("rtePlay.fps > 0", "frames")
        overlay = await page.eval("document.getElementById('overlay').innerText")
        assert session in overlay, overlay
        fps = re.search(r"fps\s+(\d+)", overlay)
        assert fps is not None and int(fps.group(1)) > 0, overlay

        prompt = await page.eval("document.getElementById('prompt').value")
        y0, x0 = worldgen.start(session)  # where the world model puts this session's camera

        still = await page.frames(0.7)  # no key: the scene stays where it is
        assert len({c for c, _ in still}) >= 5, [c for c, _ in still]
        shifts = step_shifts(still)
        assert len(shifts) >= 5 and set(shifts) == {0}, shifts
        errors = [truth_error(f, prompt, (y0, x0)) for _, f in still]
        assert max(errors) < BOUND, f"not the world at the session's start: {errors}"

        await page.eval(RECORD)  # three taps of the right arrow: the scene slides left
        for _ in range(3):
            await page.press(RIGHT)
            await asyncio.sleep(0.15)
        await asyncio.sleep(0.6)
        moved = await page.recorded()
        shifts = step_shifts(moved)
        assert shifts.count(SLIDE) >= 3, shifts
        assert set(shifts) <= {0, SLIDE}, shifts
        assert shifts[-5:] == [0] * 5, f"it goes on moving after the key is let go: {shifts}"
        # the camera went right a pixel a chunk: the last frame is the world from there
        # (a frame the page missed may hide a step or two more)
        missed = sum(j - i - 1 for (i, _), (j, _) in itertools.pairwise(moved))
        went = range(shifts.count(SLIDE), shifts.count(SLIDE) + missed + 1)
        gone = {n: truth_error(moved[-1][1], prompt, (y0, x0 + n * worldgen.SPEED)) for n in went}
        steps = min(gone, key=gone.__getitem__)
        assert gone[steps] < BOUND, f"not the world where the camera went: {gone}, {shifts}"
        position = (y0, x0 + steps * worldgen.SPEED)
        latency = await page.until("rtePlay.gatewayMs", "an action-to-frame latency")
        assert 0 < latency < 2000
        await page.until("rtePlay.browserMs", "the browser's round trip")
        shot = await page.call("Page.captureScreenshot", format="png")
        screenshot_path(tmp_path).write_bytes(base64.b64decode(shot["data"]))

        before = await page.frames(0.5)  # a new prompt through the text box
        box = await page.eval(
            "(() => { const r = document.getElementById('prompt').getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            await page.call(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box[0],
                y=box[1],
                button="left",
                clickCount=1,
            )
        await page.eval("document.getElementById('prompt').select()")
        await page.call("Input.insertText", text="lava at night")
        await page.call("Input.dispatchKeyEvent", type="keyDown", **ENTER)
        await page.call("Input.dispatchKeyEvent", type="keyUp", **ENTER)
        await asyncio.sleep(0.5)  # its encode, and the state settling
        after = await page.frames(0.5)
        again = await page.frames(0.5)
        mean = [
            np.mean([f.mean(axis=(0, 1)) for _, f in fs], axis=0) for fs in (before, after, again)
        ]
        changed, drift = np.abs(mean[1] - mean[0]).max(), np.abs(mean[2] - mean[1]).max()
        assert changed > 30 and changed > 10 * drift, (mean, changed, drift)
        errors = [truth_error(f, "lava at night", position) for _, f in again]
        assert max(errors) < BOUND, f"not the lava world at night: {errors}"

        await page.eval("rtePlay.send({prompt: 5})")  # refused by the daemon, shown in the page
        text = await page.message("the refusal")
        assert "prompt must be a str" in text, text
        await page.close()

    in_browser(browser, body)


async def sessions_become(name: str, n: int, seconds: float = 10) -> None:
    """Until daemon ``name`` has ``n`` sessions (a closed tab detaches its own)."""
    deadline = time.monotonic() + seconds
    while summary(name)["sessions"] != n:
        assert time.monotonic() < deadline, summary(name)
        await asyncio.sleep(0.05)


async def close_both(first: Page, second: Page, daemon: str) -> None:
    """Close ``second``: its session detaches and ``first`` streams on; then ``first``."""
    await second.close()
    await sessions_become(daemon, 1)
    await first.streams_on("the other tab streams on")
    await first.close()
    await sessions_become(daemon, 0)


def test_tabs_are_sessions_and_a_closed_tab_detaches(
    browser: str, play: Play, daemon: DaemonProcess
) -> None:
    async def body(http: aiohttp.ClientSession) -> None:
        first = await Page.open(http, browser, play.url)
        second = await Page.open(http, browser, play.url)
        names = [await p.until("rtePlay.session", "a session") for p in (first, second)]
        assert names[0] != names[1], names
        for page in (first, second):
            await page.until("rtePlay.fps > 0", "frames")
        shown = [(await p.frames(0.3))[-1][1] for p in (first, second)]
        prompt = await first.eval("document.getElementById('prompt').value")
        for name, frame in zip(names, shown, strict=True):  # each its own camera
            assert truth_error(frame, prompt, worldgen.start(name)) < BOUND, name
        if worldgen.start(names[0]) != worldgen.start(names[1]):  # 4095 times in 4096
            assert not np.array_equal(*shown), "two tabs show the same frames"
        assert summary(daemon.name)["sessions"] == 2

        await close_both(first, second, daemon.name)

    in_browser(browser, body)


def test_a_killed_daemon_is_engine_gone_in_the_page(
    browser: str, play: Play, daemon: DaemonProcess
) -> None:
    async def body(http: aiohttp.ClientSession) -> None:
        page = await Page.open(http, browser, play.url)
        await page.until("rtePlay.fps > 0", "frames")
        daemon.kill()
        text = await page.message("the EngineGone message")
        assert text.startswith("Engine gone:") and daemon.name in text, text
        assert await page.until("rtePlay.fps === 0", "frames stop")
        await page.close()

    try:
        in_browser(browser, body)
        assert play.wait(15) == 1
        lines = [x for x in play.said().strip().splitlines() if "waiting up to" not in x]
        assert len(lines) == 1 and lines[0].startswith("rte play: daemon"), lines
    finally:
        DaemonNames(daemon.name).remove_leftovers()


def test_play_launches_its_own_daemon_and_sigterm_stops_everything(browser: str) -> None:
    play = Play("--max-sessions", "2", "--transport", "websocket")
    pids = []
    try:

        async def body(http: aiohttp.ClientSession) -> None:
            page = await Page.open(http, browser, play.url)
            await page.until("rtePlay.fps > 0", "frames")
            assert await page.eval("rtePlay.model") == "world", "not the default model"
            assert summary(play.daemon)["sessions"] == 1
            pids.append(summary(play.daemon)["pid"])
            play.process.send_signal(signal.SIGTERM)  # with the tab open
            text = await page.until(
                "!document.getElementById('message').hidden && rtePlay.gone", "the goodbye"
            )
            assert text is True
            said = await page.eval("document.getElementById('message').innerText")
            assert said == "rte play stopped.", said
            await page.close()

        in_browser(browser, body)
        assert play.wait(30) == 0, play.said()
    finally:
        play.stop()
    assert DaemonNames(play.daemon).leftovers() == []
    assert play.said() == ""
    assert pids and not psutil.pid_exists(pids[0]), "the daemon it launched runs on"


def test_rte_works_without_aiohttp_and_play_says_what_to_install() -> None:
    def without_aiohttp(call: str) -> subprocess.CompletedProcess[str]:
        block = "import sys; sys.modules['aiohttp'] = None; from rte.cli import main; "
        return python_c(block + call, cwd=ROOT)

    helped = without_aiohttp("main(['--help'])")
    assert helped.returncode == 0 and "play" in helped.stdout, helped.stderr
    refused = without_aiohttp("sys.exit(main(['play', '--port', '0']))")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "rte[play]" in refused.stderr, refused.stderr


# -- hostile pages ------------------------------------------------------------------


class RawTab:
    """A tab as any program may open one: an aiohttp WebSocket to ``/ws``, with what
    came back (text messages parsed, frames counted) gathered by a reader task."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.texts: list[dict[str, Any]] = []
        self.frames = 0
        self.closed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, url: str) -> RawTab:
        tab = cls(await http.ws_connect(f"{url}ws", max_msg_size=0))
        await tab.until(lambda: tab.of("hello"), "the hello")
        return tab

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type is aiohttp.WSMsgType.TEXT:
                self.texts.append(json.loads(message.data))
            elif message.type is aiohttp.WSMsgType.BINARY:
                self.frames += 1
        self.closed.set()

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [t for t in self.texts if t.get("type") == kind]

    async def until(self, done: Callable[[], object], what: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert not self.closed.is_set(), f"{what}: the socket closed ({self.ws.close_code})"
            assert time.monotonic() < deadline, f"{what}: not within {timeout} s: {self.texts}"
            await asyncio.sleep(0.02)

    async def streams(self, what: str) -> None:
        count = self.frames
        await self.until(lambda: self.frames >= count + 3, f"{what}: frames")

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()


DEEP = "[" * 30000 + "]" * 30000  # past the JSON decoder's recursion limit, under 64 KiB
HOSTILE: list[tuple[str, str | bytes]] = [  # what a page (or any program) may send
    ("nested too deep", DEEP),
    ("a move nested too deep", '{"move": ' + "[" * 900 + "]" * 900 + "}"),
    ("not JSON", "{move"),
    ("not an object", "[1, 2]"),
    ("null", "null"),
    ("an unknown message", '{"jump": true}'),
    ("an empty object", "{}"),
    ("a move of a string", '{"move": "up"}'),
    ("a move of one number", '{"move": [1]}'),
    ("a move of three numbers", '{"move": [1, 0, 1]}'),
    ("a move of floats", '{"move": [0.5, NaN]}'),
    ("a move too big for 64 bits", '{"move": [1e400, 18446744073709551616]}'),
    ("a move of an object", '{"move": {"dy": 1}}'),
    ("a move of null", '{"move": null}'),
    ("a prompt of a number", '{"prompt": 5}'),
    ("a prompt of a list", '{"prompt": ["a"]}'),
    ("a prompt with a lone surrogate", '{"prompt": "\\ud800"}'),
    ("a seq of a string and a prompt of null", '{"seq": "x", "prompt": null}'),
    ("a message over 64 KiB", '{"prompt": "' + "x" * 100_000 + '"}'),
    ("a binary frame", b"\x00\xff\xfe binary"),
    ("a binary frame of JSON", b'{"move": [0, 1]}'),
]


def test_any_message_a_page_sends_is_an_error_to_it_and_every_tab_streams_on(
    play: Play, daemon: DaemonProcess
) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            hostile = await RawTab.open(http, play.url)
            bystander = await RawTab.open(http, play.url)
            await hostile.streams("before")
            for what, message in HOSTILE:
                errors = len(hostile.of("error"))
                if isinstance(message, bytes):
                    await hostile.ws.send_bytes(message)
                else:
                    await hostile.ws.send_str(message)
                await hostile.until(lambda n=errors: len(hostile.of("error")) > n, what)
                await hostile.streams(f"after {what}")
            assert len(hostile.of("error")) == len(HOSTILE), hostile.of("error")
            await bystander.streams("the bystander")
            assert bystander.of("error") == [], bystander.of("error")
            await hostile.ws.send_str('{"move": [0, 1], "seq": 7}')  # and it still steers
            await hostile.streams("a move after all that")
            assert len(hostile.of("error")) == len(HOSTILE), hostile.of("error")[-1]
            assert summary(daemon.name)["sessions"] == 2
            for tab in (hostile, bystander):
                await tab.close()

    asyncio.run(asyncio.wait_for(main(), 240))
    assert "Traceback" not in play.said(), play.said()


def test_a_frame_the_protocol_forbids_ends_that_tab_alone(
    play: Play, daemon: DaemonProcess
) -> None:
    """Text that is not UTF-8 (1007) and a message past what the gateway reads (1009)
    close the one socket, as RFC 6455 says; its session detaches, the others stream."""

    async def main() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            bystander = await RawTab.open(http, play.url)
            for codes, send in (
                ({1007}, lambda ws: ws.send_frame(b"\xff\xfe not utf-8", aiohttp.WSMsgType.TEXT)),
                # (1006 when the gateway's close comes while we still write: a reset)
                ({1009, 1006}, lambda ws: ws.send_str("x" * (17 * 1024 * 1024))),
            ):
                tab = await RawTab.open(http, play.url)
                await tab.streams("before")
                with contextlib.suppress(ConnectionError):
                    await send(tab.ws)
                await asyncio.wait_for(tab.closed.wait(), 10)
                assert tab.ws.close_code in codes, (codes, tab.ws.close_code)
                await sessions_become(daemon.name, 1)
                await bystander.streams(f"the bystander after {codes}")
            assert bystander.of("error") == [], bystander.of("error")
            await bystander.close()

    asyncio.run(asyncio.wait_for(main(), 120))
    assert "Traceback" not in play.said(), play.said()


def test_a_sigkilled_play_s_daemon_stops_and_unlinks_everything() -> None:
    play = Play("--max-sessions", "2", "--model", "null")
    daemon = summary(play.daemon)["pid"]
    try:
        play.stop(signal.SIGKILL)  # no finally of its runs
        deadline = time.monotonic() + 20
        while not ended(daemon) or DaemonNames(play.daemon).leftovers():
            assert time.monotonic() < deadline, (
                f"the daemon of a killed rte play: ended {ended(daemon)}, "
                f"left {DaemonNames(play.daemon).leftovers()}"
            )
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it served on: not after us
            os.kill(daemon, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not ended(daemon) and time.monotonic() < deadline:
            time.sleep(0.05)
        DaemonNames(play.daemon).remove_leftovers()
