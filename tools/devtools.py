"""Headless Chromium driven over the DevTools protocol, for the benchmarks.

One browser-wide DevTools WebSocket (aiohttp) with flat sessions: each page
is opened in a window of its own (a background tab composites no video, so
its ``requestVideoFrameCallback`` never fires) and spoken to by its session
id; :meth:`Browser.eval` awaits a promise the page returns. The flags turn
off everything Chromium would do in the background, resolve no name but
127.0.0.1 and localhost, and let WebRTC use loopback and play video at once.
The tests have their own driver (``tests/test_play.py``): tools are never
imported by tests' helpers and the other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from typing import IO, Any

import aiohttp

FLAGS = [  # headless, nothing in the background, loopback WebRTC, video played at once
    *("--headless=new", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1"),
    *("--no-first-run", "--no-default-browser-check", "--disable-background-networking"),
    *("--disable-component-update", "--disable-sync", "--disable-default-apps"),
    *("--disable-breakpad", "--no-sandbox", "--disable-dev-shm-usage", "--mute-audio"),
    "--window-size=640,720",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE localhost",
    "--disable-features=Translate,OptimizationHints,MediaRouter,WebRtcHideLocalIpsWithMdns",
    *("--allow-loopback-in-peer-connection", "--autoplay-policy=no-user-gesture-required"),
    *("--disable-renderer-backgrounding", "--disable-background-timer-throttling"),
]


class Browser:
    """Headless Chromium, driven over one DevTools connection (flat sessions)."""

    def __init__(self) -> None:
        chromium = shutil.which("chromium")
        if chromium is None:
            raise SystemExit("the video bench needs chromium: bash tools/install_browser.sh")
        self.profile = tempfile.TemporaryDirectory(prefix="bench-video-")
        self.log: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in close)
        command = [chromium, *FLAGS, f"--user-data-dir={self.profile.name}", "about:blank"]
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            self.log.seek(0)
            if found := re.search(r"DevTools listening on (ws://\S+)", self.log.read()):
                self.devtools = found.group(1)
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("chromium did not start")
            time.sleep(0.05)
        self._next, self._waiting = 0, dict[int, asyncio.Future[dict[str, Any]]]()

    async def connect(self, http: aiohttp.ClientSession) -> None:
        self.ws = await http.ws_connect(self.devtools, max_msg_size=0)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            waiting = self._waiting.pop(data.get("id", -1), None)
            if waiting is not None and not waiting.done():
                waiting.set_result(data)

    async def call(self, method: str, session: str | None = None, **params: Any) -> Any:
        self._next += 1
        answer = self._waiting[self._next] = asyncio.get_running_loop().create_future()
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        await self.ws.send_str(json.dumps(message | ({"sessionId": session} if session else {})))
        reply = await asyncio.wait_for(answer, 30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    async def open(self, url: str) -> str:
        """A page of ``url`` in a new window; its DevTools session."""
        target = await self.call("Target.createTarget", url=url, newWindow=True)
        got = await self.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        return str(got["sessionId"])

    async def eval(self, session: str, expression: str) -> Any:
        reply = await self.call(
            "Runtime.evaluate", session, expression=expression, returnByValue=True,
            awaitPromise=True,
        )  # fmt: skip
        if "exceptionDetails" in reply:
            return None  # the page is not there yet (or went)
        return reply["result"].get("value")

    async def until(self, session: str, expression: str, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not await self.eval(session, expression):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {timeout} s")
            await asyncio.sleep(0.1)

    async def close_all(self, sessions: list[str]) -> None:
        for session in sessions:
            with contextlib.suppress(RuntimeError, asyncio.TimeoutError):
                await self.call("Page.close", session)
        sessions.clear()

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.log.close()
        self.profile.cleanup()
