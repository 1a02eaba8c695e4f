"""Recording on request: ``POST`` and ``DELETE /recordings/SESSION`` of the gateway's app.

A real daemon of the trained ``world`` model, a real gateway (embedded in this
test's event loop through :func:`rte.play.app.make_app`, and ``rte play`` in a
child process), and a tab that is a real WebSocket of the fallback transport
(no browser is needed to be a tab). A stopped recording must be a file PyAV
decodes, holding every frame the daemon made for the session while it ran
(its sidecar's chunks are consecutive, none dropped), each the world's.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import av
import pytest
from aiohttp import web
from daemon_harness import DaemonProcess
from test_play import Play, truth_error

from rte.client import connect_async
from rte.models import worldgen
from rte.play.app import make_app
from rte.play.gateway import Gateway

CODEC_BOUND = 8.0  # a decoded frame's mean absolute error (of 255) to the world's truth


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    # admission by rows: these tests are of the browser path, and a loaded box can
    # measure the real-time capacity below the tabs they open (its own tests: test_realtime)
    args = ("--model", "world", "--pace-hz", "30", "--max-sessions", "2", "--admission", "rows")
    process = DaemonProcess(f"{shm_prefix}rec", *args)
    yield process
    if process.process.poll() is None:
        process.stop()


class SocketTab:
    """A tab over ``GET /ws``: its session's name, and the chunks it was sent."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, hello: dict[str, Any]) -> None:
        self.ws, self.session, self.chunks = ws, str(hello["session"]), list[int]()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, url: str) -> SocketTab:
        ws = await http.ws_connect(f"{url}ws")
        hello = json.loads((await ws.receive(timeout=10)).data)
        assert hello["type"] == "hello", hello
        return cls(ws, hello)

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type is aiohttp.WSMsgType.BINARY:
                self.chunks.append(struct.unpack_from("<I", message.data)[0])

    async def close(self) -> None:
        self._reader.cancel()
        await self.ws.close()


async def send(http: aiohttp.ClientSession, method: str, url: str) -> tuple[int, Any]:
    async with http.request(method, url) as response:
        return response.status, await response.json()


def check_recording(stopped: dict[str, Any], session: str, sent: list[int]) -> list[int]:
    """The stopped recording is a finished MP4 of every frame its sidecar lists: the
    session's consecutive chunks, each the world's; the chunks it holds."""
    assert stopped["done"] and stopped["error"] is None and stopped["dropped"] == 0, stopped
    sidecar = Path(stopped["path"]).with_suffix(".jsonl")
    lines = [json.loads(line) for line in sidecar.read_text().splitlines()]
    chunks = [line["chunk"] for line in lines if "frame" in line]
    assert lines[-1] == {"end": True, "frames": len(chunks), "dropped": 0}, lines[-1]
    assert len(chunks) == stopped["frames"] >= 20, stopped
    assert chunks == list(range(chunks[0], chunks[0] + len(chunks))), chunks
    inside = [c for c in sent if chunks[0] <= c <= chunks[-1]]
    assert inside and set(inside) <= set(chunks), (inside, chunks)  # what the tab was sent
    with av.open(stopped["path"]) as container:
        pictures = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(pictures) == len(chunks), (len(pictures), len(chunks))
    start = worldgen.start(session)
    for picture in pictures[:: max(1, len(pictures) // 8)]:
        assert truth_error(picture[4::8, 4::8], "a forest", start) <= CODEC_BOUND
    return chunks


def test_a_recording_started_and_stopped_over_http_is_every_frame_and_refusals_say_why(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    async def main() -> None:
        client = await connect_async(daemon.name, 30)
        gateway = Gateway(
            client, prompt="a forest", max_fps=60, record=tmp_path, record_from_start=False
        )
        runner = web.AppRunner(make_app(gateway, webrtc=None))  # closes gateway and client
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}/"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                await asyncio.wait_for(steps(http, url, gateway), 60)
        finally:
            await runner.cleanup()

    async def steps(http: aiohttp.ClientSession, url: str, gateway: Gateway) -> None:
        for method in ("POST", "DELETE"):  # no tab of that session
            status, said = await send(http, method, f"{url}recordings/tab-nobody")
            assert status == 404 and "no tab of session 'tab-nobody'" in said["error"], said
        tab = await SocketTab.open(http, url)
        recordings = f"{url}recordings/{tab.session}"
        assert not list(tmp_path.iterdir()), "recorded from the start without being asked"
        status, said = await send(http, "DELETE", recordings)
        assert status == 409 and "is not recording" in said["error"], said

        status, started = await send(http, "POST", recordings)
        assert status == 201 and started["path"] == str(tmp_path / f"{tab.session}.mp4"), started
        status, said = await send(http, "POST", recordings)  # twice
        assert status == 409 and "already recording" in said["error"], said
        await asyncio.sleep(1.5)
        status, stopped = await send(http, "DELETE", recordings)
        assert status == 200 and stopped["path"] == started["path"], stopped
        status, said = await send(http, "DELETE", recordings)  # twice
        assert status == 409 and "is not recording" in said["error"], said
        first = check_recording(stopped, tab.session, tab.chunks)

        status, again = await send(http, "POST", recordings)  # a second one, a file of its own
        assert status == 201 and again["path"] == str(tmp_path / f"{tab.session}-2.mp4"), again
        await asyncio.sleep(1.0)
        status, stopped = await send(http, "DELETE", recordings)
        assert status == 200, stopped
        assert check_recording(stopped, tab.session, tab.chunks)[0] > first[-1]

        gateway.record = None  # a gateway given no directory
        status, said = await send(http, "POST", recordings)
        assert status == 409 and "records nowhere" in said["error"], said
        await tab.close()

    asyncio.run(main())


def test_rte_play_record_records_every_tab_and_the_api_stops_and_restarts_it(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    play = Play(
        "--name", daemon.name, "--wait", "30", "--transport", "websocket", "--record", str(tmp_path)
    )

    async def steps(http: aiohttp.ClientSession) -> None:
        tab = await SocketTab.open(http, play.url)
        recordings = f"{play.url}recordings/{tab.session}"
        await asyncio.sleep(1.5)
        status, said = await send(http, "POST", recordings)  # recording since it opened
        assert status == 409 and "already recording" in said["error"], said
        status, stopped = await send(http, "DELETE", recordings)
        assert status == 200 and stopped["path"] == str(tmp_path / f"{tab.session}.mp4")
        check_recording(stopped, tab.session, tab.chunks)
        status, again = await send(http, "POST", recordings)
        assert status == 201 and again["path"].endswith(f"{tab.session}-2.mp4"), again
        await tab.close()

    async def main() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            await asyncio.wait_for(steps(http), 60)

    try:
        asyncio.run(main())
    finally:
        play.stop()
