"""``rte play`` over WebRTC in a real browser, on loopback alone.

The test's thread moves into a network namespace of its own holding only
``lo`` (``unshare(CLONE_NEWNET)``, as root) before it starts Chromium and
``rte play``, which inherit it: ICE can find nothing but 127.0.0.1, and no
STUN or TURN server is configured; at the end every socket of theirs is
checked to have had no peer but 127.0.0.1. The daemon needs no network (shared
memory), so it is the same as :mod:`test_play`'s. Frames are read back from the
``<video>`` on each displayed frame (``requestVideoFrameCallback``), with the
chunk and ``seq`` the gateway stamped into them (:mod:`rte.play.picture`), and
compared with the world the model learned, within the codec's tolerance.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import psutil
import pytest
from daemon_harness import DaemonProcess
from test_play import (
    CHROMIUM_FLAGS,
    RIGHT,
    SLIDE,
    Page,
    Play,
    chromium,
    close_both,
    in_browser,
    recorder,
    remote_peers,
    screenshot_path,
    sessions_become,
    step_shifts,
    truth_error,
    world_daemon,
)

from rte.ipc.inspect import summary
from rte.models import worldgen
from rte.protocol.names import DaemonNames

CODEC_BOUND = 8.0  # a decoded frame's mean absolute error (of 255) to the world's truth
CLONE_NEWNET = 0x40000000
RTC_FLAGS = [
    *(f for f in CHROMIUM_FLAGS if not f.startswith(("--disable-features=", "--host-resolver"))),
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE localhost",
    "--disable-features=Translate,OptimizationHints,MediaRouter,WebRtcHideLocalIpsWithMdns,"
    "SpareRendererForSitePerProcess",
    "--allow-loopback-in-peer-connection",
    "--autoplay-policy=no-user-gesture-required",
    "--disable-renderer-backgrounding",
    "--disable-background-timer-throttling",
]
# what the video showed: the picture whose stamp said the chunk (rtePlay.picture,
# one drawing of the frame), not the video drawn again (it may have moved on)
RECORD = recorder("rtePlay.picture")


# -- loopback alone ---------------------------------------------------------------


@pytest.fixture(scope="module")
def loopback_only() -> Iterator[None]:
    """This thread (and what it starts) in a network namespace of only ``lo``."""
    libc = ctypes.CDLL(None, use_errno=True)
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            pytest.fail(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())} (run as root)")
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)
        devices = Path("/proc/thread-self/net/dev").read_text().splitlines()[2:]
        assert [line.split(":")[0].strip() for line in devices] == ["lo"], devices
        yield
    finally:
        libc.setns(original, CLONE_NEWNET)
        os.close(original)


@pytest.fixture(scope="module")
def browser(loopback_only: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Headless Chromium in that namespace; yields its DevTools address."""
    yield from chromium(RTC_FLAGS, tmp_path_factory.mktemp("chromium-rtc"))


@pytest.fixture
def daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    """test_play's daemon, named from the test's prefix."""
    yield from world_daemon(f"{shm_prefix}rtc")


@pytest.fixture
def play(loopback_only: None, daemon: DaemonProcess, tmp_path: Path) -> Iterator[Play]:
    """``rte play --name`` of that daemon, over WebRTC, recording to tmp_path/rec."""
    process = Play("--name", daemon.name, "--wait", "30", "--record", str(tmp_path / "rec"))
    yield process
    elsewhere = remote_peers(process.process.pid)
    process.stop()
    assert not elsewhere, f"rte play contacted more than this machine: {elsewhere}"


async def stats(http: aiohttp.ClientSession, play: Play) -> dict[str, Any]:
    async with http.get(f"{play.url}stats") as response:
        result: dict[str, Any] = await response.json()
        return result


class VideoPage(Page):
    """A page in a window of its own (a background tab composites no video, so
    its ``requestVideoFrameCallback`` never fires), whose frames are read back
    from its ``<video>``."""

    record = RECORD  # the pictures of its <video>

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, devtools: str, url: str) -> Page:
        async with http.get(f"{devtools}/json/version") as response:
            version = await response.json()
        async with http.ws_connect(version["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            create = {"url": url, "newWindow": True}
            await ws.send_str(
                json.dumps({"id": 1, "method": "Target.createTarget", "params": create})
            )
            reply = json.loads((await ws.receive(timeout=15)).data)
        target_id = reply["result"]["targetId"]
        async with http.get(f"{devtools}/json/list") as response:
            target = next(t for t in await response.json() if t["id"] == target_id)
        return await cls.attach(http, devtools, target)


async def open_rtc(http: aiohttp.ClientSession, browser: str, url: str) -> Page:
    page = await VideoPage.open(http, browser, url)
    await page.until("rtePlay.session && rtePlay.frames > 3", "WebRTC frames", 20)
    assert await page.eval("rtePlay.transport") == "webrtc"
    return page


def placed(
    frames: list[tuple[int, np.ndarray[Any, Any]]], prompt: str, start: tuple[int, int]
) -> list[tuple[int, int, float]]:
    """For each frame, (its chunk, the camera's steps right of ``start`` whose view it
    is nearest, that error): what a failure shows of where each frame was."""
    y0, x0 = start
    out = []
    for chunk, frame in frames:
        errors = {n: truth_error(frame, prompt, (y0, x0 + n * worldgen.SPEED)) for n in range(40)}
        n = min(errors, key=errors.__getitem__)
        out.append((chunk, n, round(errors[n], 1)))
    return out


async def each_its_own_camera(pages: list[Page], names: list[str]) -> None:
    """Each page's latest frame is the forest from its own session's start."""
    shown = [(await p.frames(0.3))[-1][1] for p in pages]
    for name, frame in zip(names, shown, strict=True):
        assert truth_error(frame, "a forest", worldgen.start(name)) <= CODEC_BOUND, name


def decoded(frames: list[tuple[int, np.ndarray[Any, Any]]]) -> list[int]:
    return [c for c, _ in frames]


# -- the tests --------------------------------------------------------------------


def test_webrtc_video_is_the_world_and_keys_steer_it(
    browser: str, play: Play, tmp_path: Path
) -> None:
    async def body(http: aiohttp.ClientSession) -> None:
        page = await open_rtc(http, browser, play.url)
        session = await page.eval("rtePlay.session")
        assert await page.eval("!rtePlay.video.paused && rtePlay.video.readyState >= 2")
        prompt = await page.eval("document.getElementById('prompt').value")
        y0, x0 = worldgen.start(session)

        still = await page.frames(0.8)
        assert len(set(decoded(still))) >= 10, decoded(still)
        assert set(step_shifts(still)) == {0}, step_shifts(still)
        errors = [truth_error(f, prompt, (y0, x0)) for _, f in still]
        assert max(errors) <= CODEC_BOUND, f"not the world at the session's start: {errors}"

        await page.eval(RECORD)  # hold the right arrow (the moves data channel)
        await page.call("Input.dispatchKeyEvent", type="keyDown", **RIGHT)
        await asyncio.sleep(0.5)
        await page.call("Input.dispatchKeyEvent", type="keyUp", **RIGHT)
        await asyncio.sleep(0.7)
        moved = await page.recorded()
        shifts = step_shifts(moved)
        where = placed(moved, prompt, (y0, x0))
        assert shifts.count(SLIDE) >= 5, (shifts, where)
        assert set(shifts) <= {0, SLIDE}, (shifts, where)
        assert shifts[-5:] == [0] * 5, f"it goes on moving after the key is let go: {shifts}"
        # steps the camera may have taken between two frames the page showed that are
        # not of consecutive chunks (their shift is not in ``shifts``): one a chunk, the
        # last one's included (counted without it, or a frame shown twice counted as -1,
        # the range below came out short; both seen failing)
        missed = sum(j - i for (i, _), (j, _) in itertools.pairwise(moved) if j > i + 1)
        went = range(shifts.count(SLIDE), shifts.count(SLIDE) + missed + 1)
        gone = {n: truth_error(moved[-1][1], prompt, (y0, x0 + n * worldgen.SPEED)) for n in went}
        steps = min(gone, key=gone.__getitem__)
        assert gone[steps] <= CODEC_BOUND, f"not the world where the camera went: {gone}, {where}"
        assert 0 < await page.until("rtePlay.gatewayMs", "the gateway's latency") < 2000
        assert 0 < await page.until("rtePlay.browserMs", "action to displayed frame") < 2000
        shot = await page.call("Page.captureScreenshot", format="png")
        screenshot_path(tmp_path).write_bytes(base64.b64decode(shot["data"]))

        position = (y0, x0 + steps * worldgen.SPEED)
        await page.eval("rtePlay.send({prompt: 'lava at night'})")  # the control channel
        await asyncio.sleep(0.6)
        lava = await page.frames(0.5)
        errors = [truth_error(f, "lava at night", position) for _, f in lava]
        assert max(errors) <= CODEC_BOUND, f"not the lava world at night: {errors}"
        await page.eval("rtePlay.send({prompt: 5})")
        text = await page.message("the refusal")
        assert "prompt must be a str" in text, text
        await page.eval("rtePlay.send({renegotiate: 'v=0'})")  # a restart that adds no video
        text = await page.until(
            "(() => { const t = document.getElementById('message').innerText;"
            " return t.includes('video restart') && t; })()",
            "the restart's refusal",
        )
        assert "must add one video m-line" in text, text
        await page.streams_on("frames after the refused restart")
        await page.close()

    in_browser(browser, body)


def test_two_tabs_a_stalled_one_recovers_a_closed_one_detaches(
    browser: str, play: Play, daemon: DaemonProcess
) -> None:
    """A tab whose renderer is stopped for 5 s (SIGSTOP: it reads nothing) drops
    frames at the gateway, whose memory does not grow, while the other tab streams
    on; within a second of its return its frames are fresh again. (Chromium's
    receiver alone showed them 3 s late, then caught up by about 100 ms a
    second: the frames sent before the gateway saw the stall arrive in a burst
    and its jitter buffer learns that delay; the page asks for a fresh track.)"""

    async def body(http: aiohttp.ClientSession) -> None:
        first = await open_rtc(http, browser, play.url)
        renderers = _renderers()
        # another site (localhost, not 127.0.0.1): a renderer process of its own
        second = await open_rtc(http, browser, play.url.replace("127.0.0.1", "localhost"))
        stalled = _renderers() - renderers
        assert len(stalled) == 1, stalled
        names = [await p.eval("rtePlay.session") for p in (first, second)]
        assert names[0] != names[1]
        assert summary(daemon.name)["sessions"] == 2
        await each_its_own_camera([first, second], names)
        normal = await second.until("rtePlay.ageMs", "the frame age")

        gateway = psutil.Process(play.process.pid)
        rss = gateway.memory_info().rss
        before = {t["session"]: t for t in (await stats(http, play))["tabs"]}
        count = await first.eval("rtePlay.frames")
        for pid in stalled:
            os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(5)
            got = await first.eval("rtePlay.frames")
            # streams on: at least half the 30 Hz pace (a tab held up by the stalled one
            # would show next to none; 25 a second failed once at 24 under CI's load)
            assert got - count >= 5 * 15, f"the other tab stalled: {got - count} frames in 5 s"
            assert gateway.memory_info().rss < rss + 32 * 2**20, "the gateway's memory grew"
        finally:
            for pid in stalled:
                os.kill(pid, signal.SIGCONT)
        back = time.monotonic()
        await second.eval("rtePlay.ageMs = null")
        age = await second.until("rtePlay.ageMs !== null && rtePlay.ageMs", "fresh frames", 5)
        await second.until(f"rtePlay.ageMs < {max(normal, 30) * 3}", "fresh frames", 2)
        assert time.monotonic() - back < 1.0, age
        assert await second.eval("rtePlay.restarts") >= 1, "it recovered without a fresh track"
        after = {t["session"]: t for t in (await stats(http, play))["tabs"]}
        assert after[names[1]]["dropped"] > before[names[1]]["dropped"] + 100, (before, after)

        await close_both(first, second, daemon.name)

    in_browser(browser, body)


def _renderers() -> set[int]:
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any("--type=renderer" in part for part in cmdline):
            found.add(process.pid)
    return found


def test_a_recording_plays_back_and_a_closed_tab_detaches(
    browser: str, play: Play, daemon: DaemonProcess, tmp_path: Path
) -> None:
    async def body(http: aiohttp.ClientSession) -> None:
        page = await open_rtc(http, browser, play.url)
        session = await page.eval("rtePlay.session")
        await asyncio.sleep(3)
        await page.close()
        await sessions_become(daemon.name, 0, 15)  # the page's heartbeat stops
        deadline = time.monotonic() + 10
        sidecar = tmp_path / "rec" / f"{session}.jsonl"
        while not (sidecar.exists() and '"end"' in sidecar.read_text()):
            assert time.monotonic() < deadline, "the recording was not finished"
            await asyncio.sleep(0.05)
        lines = [json.loads(line) for line in sidecar.read_text().splitlines()]
        frames = [line for line in lines if "frame" in line]
        end = lines[-1]
        assert end["frames"] == len(frames) and len(frames) >= 80, end  # 3 s and more
        chunks = [f["chunk"] for f in frames]
        assert chunks == sorted(chunks) and len(set(chunks)) == len(chunks)
        with av.open(str(tmp_path / "rec" / f"{session}.mp4")) as container:
            pictures = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(pictures) == len(frames), (len(pictures), len(frames))
        start = worldgen.start(session)
        for picture in pictures[:: len(pictures) // 10]:
            scene = picture[4::8, 4::8]
            assert truth_error(scene, "a forest", start) <= CODEC_BOUND

    in_browser(browser, body)


def test_two_tabs_are_two_sessions_and_a_killed_daemon_ends_every_stream(
    browser: str, play: Play, daemon: DaemonProcess
) -> None:
    async def body(http: aiohttp.ClientSession) -> None:
        pages = [await open_rtc(http, browser, play.url) for _ in range(2)]
        names = [await p.eval("rtePlay.session") for p in pages]
        assert names[0] != names[1] and summary(daemon.name)["sessions"] == 2, names
        await each_its_own_camera(pages, names)
        daemon.kill()
        for page in pages:
            text = await page.message("the EngineGone message")
            assert text.startswith("Engine gone:") and daemon.name in text, text
            await page.until("rtePlay.fps === 0", "frames stop")
        for page in pages:
            await page.close()

    try:
        in_browser(browser, body)
        assert play.wait(15) == 1
    finally:
        DaemonNames(daemon.name).remove_leftovers()
