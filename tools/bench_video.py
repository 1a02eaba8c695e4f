"""Video out: what a viewer feels per tab at N tabs, WebRTC against the WebSocket.

One run starts two ``rte play`` (each launches its own daemon of the trained
``world`` model at 30 Hz), one per transport, and a headless Chromium; for
each transport it opens tabs (each in a window of its own: a background tab
composites no video) up to each size of :attr:`Plan.tabs`, lets them settle
and measures for :attr:`Plan.seconds`, all tabs at once:

* in each page (over the DevTools protocol): frames displayed per second
  (``requestVideoFrameCallback`` over WebRTC, a canvas draw over the
  WebSocket), each displayed frame's age (from when the daemon began making
  it, by the wall clock both share: ``rtePlay.ageMs``), bytes received per
  second (``getStats``' ``inbound-rtp`` over WebRTC, the socket's messages
  over the WebSocket), and over WebRTC the codec, the jitter buffer's mean
  delay and the mean decode time;
* of the gateway (the ``rte play`` process alone, not its daemon): CPU in %
  of one core over the window (and per tab) and its RSS at the end; from its
  ``GET /stats``, the frames it sent and dropped per tab per second.

``x_raw`` is a tab's bytes/s over the raw RGB of the picture it displays
(the upscaled scene at the same frames/s): what encoding saves. The ratios
table divides WebRTC's figures by the WebSocket's at the same size. Encode
time is measured apart, in this process, on the same pictures the gateway
encodes (a walk through the world, upscaled and stamped, 256x288), with
aiortc's own VP8 and H.264 encoders: one frame after another, as its sender
does, p50 and p99, and the bytes a frame.

    python -m tools.bench_video [--tabs 1 4 16] [--seconds 5] [--json] [--quick]

Needs Chromium (``tools/install_browser.sh``) and ``rte[play]``. It is a
benchmark, not a test: on a loaded box every figure moves.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import IO, Any

import aiohttp
import numpy as np
import psutil

from rte.launch import LaunchedDaemon
from tools import report
from tools.devtools import Browser

TRANSPORTS = ("webrtc", "websocket")
# what a page counts from now on; and what it counted (both awaited promises)
BEGIN = """(async () => {
  const inbound = async () => { let got = null; if (!rtePlay.pc) return got;
    (await rtePlay.pc.getStats()).forEach((r) => {
      if (r.type === "inbound-rtp" && r.kind === "video") got = r; });
    return got; };
  const r = await inbound();
  window.__bench = { inbound, frames: 0, ages: [], t0: performance.now(), bytes: rtePlay.bytes,
    rtp: r && { bytes: r.bytesReceived, jitter: r.jitterBufferDelay,
                emitted: r.jitterBufferEmittedCount, decode: r.totalDecodeTime,
                decoded: r.framesDecoded } };
  rtePlay.onframe = () => { __bench.frames += 1;
    if (rtePlay.ageMs !== null && __bench.ages.length < 20000) __bench.ages.push(rtePlay.ageMs); };
  return true;
})()"""
END = """(async () => {
  const b = __bench, r = await b.inbound(), s = (performance.now() - b.t0) / 1000;
  rtePlay.onframe = null;
  const out = { frames: b.frames, seconds: s, ages: b.ages, bytes: rtePlay.bytes - b.bytes,
                codec: "raw", jitter_ms: null, decode_ms: null, restarts: rtePlay.restarts };
  if (r && b.rtp) {
    out.bytes = r.bytesReceived - b.rtp.bytes;
    const emitted = r.jitterBufferEmittedCount - b.rtp.emitted;
    const decoded = r.framesDecoded - b.rtp.decoded;
    if (emitted) out.jitter_ms = (r.jitterBufferDelay - b.rtp.jitter) / emitted * 1000;
    if (decoded) out.decode_ms = (r.totalDecodeTime - b.rtp.decode) / decoded * 1000;
    const codec = (await rtePlay.pc.getStats()).get(r.codecId);
    if (codec) out.codec = codec.mimeType.replace("video/", "");
  }
  return out;
})()"""

MESSAGE = "document.getElementById('message').innerText"
COLUMNS = ["transport", "tabs", "fps_p50", "fps_min", "age_p50_ms", "age_p95_ms"]
COLUMNS += ["kbytes_per_s", "x_raw", "cpu_pct", "cpu_per_tab_pct", "rss_mb"]
COLUMNS += ["made_per_s", "dropped_per_s", "jitter_ms", "decode_ms", "codec", "restarts"]
RATIO_COLUMNS = ["tabs", "fps_x", "age_p50_x", "age_p95_x", "bytes_x", "cpu_x", "rss_x"]
ENCODE_COLUMNS = ["codec", "size", "picture_p50_ms", "encode_p50_ms", "encode_p99_ms"]
ENCODE_COLUMNS += ["bytes_per_frame"]
TABLES: list[report.TableSpec] = [
    ("Video: per tab at N tabs, each transport (medians over tabs)", "rows", {}, COLUMNS),
    ("Video: WebRTC over the WebSocket at the same tabs", "ratios", {}, RATIO_COLUMNS),
    ("Video: encode time per frame, measured apart", "encode", {}, ENCODE_COLUMNS),
]


@dataclass(frozen=True)
class Plan:
    tabs: tuple[int, ...] = (1, 4, 16)
    seconds: float = 5.0  # measured, per size and transport
    settle_s: float = 2.0  # after the last tab of a size showed frames
    encode_frames: int = 300


QUICK = Plan(tabs=(1, 2), seconds=1.5, settle_s=1.0, encode_frames=30)


class Play:
    """``rte serve`` of the world at 30 Hz (admission by rows alone: the bench asks
    for more tabs than the real-time admission may take on a small box) and
    ``rte play --name`` of it over ``transport``; :meth:`stop` stops both."""

    def __init__(self, transport: str, sessions: int) -> None:
        self.log: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in stop)
        self.name = f"bench-video-{os.getpid()}-{transport}"
        serve = ["--model", "world", "--pace-hz", "30", "--max-sessions", str(sessions)]
        self.daemon = LaunchedDaemon(self.name, [*serve, "--admission", "rows"])
        try:
            self.daemon.wait_ready(60)  # a daemon that cannot start says so now, in its words
        except BaseException:
            self.daemon.stop()
            self.log.close()
            raise
        command = [sys.executable, "-m", "rte", "play", "--port", "0", "--transport", transport]
        command += ["--name", self.name, "--wait", "60"]
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log
        )
        line = _line(self.process, 90)
        found = re.search(r"open (http://127\.0\.0\.1:\d+/)", line)
        if found is None:
            self.stop()
            raise RuntimeError(f"rte play --transport {transport} did not start: {self.said}")
        self.url, self.ps = found.group(1), psutil.Process(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.daemon.stop()  # SIGTERM, then SIGKILL after its grace; its leftovers removed
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.seek(0)
        self.said = self.log.read()[-2000:] + self.daemon.last_words()
        self.log.close()


def _line(process: subprocess.Popen[bytes], timeout: float) -> str:
    assert process.stdout is not None
    deadline, line = time.monotonic() + timeout, b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([process.stdout], [], [], left)[0]:
            break
        if not (byte := os.read(process.stdout.fileno(), 1)):
            break
        line += byte
    return line.decode(errors="replace")


async def _stats(http: aiohttp.ClientSession, play: Play) -> dict[str, dict[str, Any]]:
    async with http.get(f"{play.url}stats") as response:
        return {t["session"]: t for t in (await response.json())["tabs"]}


async def _tabs_gone(http: aiohttp.ClientSession, play: Play, timeout: float) -> None:
    """Wait (bounded) for closed pages' peers to leave, so they cost nothing later."""
    deadline = time.monotonic() + timeout
    while await _stats(http, play) and time.monotonic() < deadline:
        await asyncio.sleep(0.25)


async def _measure(
    http: aiohttp.ClientSession, browser: Browser, play: Play, pages: list[str], plan: Plan
) -> dict[str, Any]:
    """All of ``play``'s tabs at once for ``plan.seconds``: one row."""
    await asyncio.sleep(plan.settle_s)
    before = await _stats(http, play)
    cpu = play.ps.cpu_times()
    began = time.monotonic()
    await asyncio.gather(*(browser.eval(p, BEGIN) for p in pages))
    await asyncio.sleep(plan.seconds)
    got = await asyncio.gather(*(browser.eval(p, END) for p in pages))
    wall = time.monotonic() - began
    used, rss = play.ps.cpu_times(), play.ps.memory_info().rss
    after = await _stats(http, play)
    fps = [g["frames"] / g["seconds"] for g in got]
    rates = [g["bytes"] / g["seconds"] for g in got]
    ages = np.concatenate([np.asarray(g["ages"], np.float64) for g in got] + [np.zeros(0)])
    raw = [f * 256 * 256 * 3 for f in fps]  # the displayed scene, uncompressed
    dropped = [after[s]["dropped"] - before[s]["dropped"] for s in after if s in before]
    made = [after[s]["chunk"] - before[s]["chunk"] for s in after if s in before]
    cpu_pct = (used.user + used.system - cpu.user - cpu.system) / wall * 100
    webrtc = [g for g in got if g["codec"] != "raw"]
    return {
        "tabs": len(pages),
        "fps_p50": float(np.median(fps)),
        "fps_min": float(min(fps)),
        "age_p50_ms": float(np.percentile(ages, 50)) if ages.size else None,
        "age_p95_ms": float(np.percentile(ages, 95)) if ages.size else None,
        "kbytes_per_s": float(np.median(rates)) / 1000,
        "x_raw": float(np.median([r / w for r, w in zip(rates, raw, strict=True) if w])),
        "cpu_pct": cpu_pct,
        "cpu_per_tab_pct": cpu_pct / len(pages),
        "rss_mb": rss / 2**20,
        "made_per_s": float(np.median(made)) / wall if made else 0.0,
        "dropped_per_s": float(np.median(dropped)) / wall if dropped else 0.0,
        "jitter_ms": _median([g["jitter_ms"] for g in webrtc]),
        "decode_ms": _median([g["decode_ms"] for g in webrtc]),
        "codec": got[0]["codec"],
        "restarts": sum(g["restarts"] for g in got),  # fresh video tracks, from each tab's start
    }


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else None


async def _transport(
    http: aiohttp.ClientSession, browser: Browser, play: Play, transport: str, plan: Plan
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    pages: list[str] = []
    query = "" if transport == "webrtc" else "?transport=websocket"
    for size in plan.tabs:
        try:
            while len(pages) < size:
                pages.append(page := await browser.open(f"{play.url}{query}"))
                await browser.until(page, "rtePlay.frames > 3", f"{transport} tab {len(pages)}", 30)
        except RuntimeError as exc:  # say so, and measure no larger size of it
            print(f"video: {exc}; the page says {await browser.eval(page, MESSAGE)!r}",
                  file=sys.stderr)  # fmt: skip
            break
        row = {"transport": transport, **await _measure(http, browser, play, pages, plan)}
        report.progress("video", len(rows) + 1, len(plan.tabs), f"{transport} x{size}")
        rows.append(row)
    await browser.close_all(pages)
    await _tabs_gone(http, play, 15)
    return rows


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["transport"], r["tabs"]): r for r in rows}
    out = []
    for (transport, tabs), rtc in by.items():
        ws = by.get(("websocket", tabs))
        if transport != "webrtc" or ws is None:
            continue
        pairs = {"fps_x": "fps_p50", "age_p50_x": "age_p50_ms", "age_p95_x": "age_p95_ms"}
        pairs |= {"bytes_x": "kbytes_per_s", "cpu_x": "cpu_pct", "rss_x": "rss_mb"}
        ratio: dict[str, Any] = {"tabs": tabs}
        for name, key in pairs.items():
            a, b = rtc[key], ws[key]
            ratio[name] = a / b if a is not None and b else None
        out.append(ratio)
    return out


def encode_times(n_frames: int) -> list[dict[str, Any]]:
    """aiortc's VP8 and H.264 encoders on a walk through the world, as the gateway
    makes its pictures, one frame after the other."""
    from aiortc.codecs.h264 import H264Encoder  # noqa: PLC0415 (rte[play])
    from aiortc.codecs.vpx import Vp8Encoder  # noqa: PLC0415
    from av import VideoFrame  # noqa: PLC0415

    from rte.models import worldgen  # noqa: PLC0415
    from rte.play.picture import scale_for, stamped  # noqa: PLC0415

    rows = []
    for codec, encoder in (("VP8", Vp8Encoder()), ("H264", H264Encoder())):
        pictures, encodes, sizes = [], [], []
        for i in range(n_frames):
            began = time.perf_counter_ns()
            scene = worldgen.view("a forest", (3, i))
            picture = stamped(scene, scale_for(scene.shape[:2]), i, 0, i * 33)
            frame = VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts, frame.time_base = i * 3000, Fraction(1, 90_000)
            made = time.perf_counter_ns()
            payloads, _ = encoder.encode(frame)
            encodes.append(time.perf_counter_ns() - made)
            pictures.append(made - began)
            sizes.append(sum(len(p) for p in payloads))
        height, width = picture.shape[:2]
        rows.append(
            {
                "codec": codec,
                "size": f"{width}x{height}",
                "picture_p50_ms": float(np.median(pictures)) / 1e6,
                "encode_p50_ms": float(np.percentile(encodes, 50)) / 1e6,
                "encode_p99_ms": float(np.percentile(encodes, 99)) / 1e6,
                "bytes_per_frame": float(np.median(sizes[1:] or sizes)),
            }
        )
    return rows


def run(plan: Plan = Plan()) -> dict[str, Any]:
    """Every size on both transports, then the encoders apart: the suite's result."""
    plays, browser = [], None
    try:
        plays = [Play(t, max(plan.tabs)) for t in TRANSPORTS]
        browser = Browser()
        rows = asyncio.run(_browse(browser, plays, plan))
    finally:
        if browser is not None:
            browser.close()
        for play in plays:
            play.stop()
    rows.sort(key=lambda r: (r["tabs"], r["transport"]))
    encode = encode_times(plan.encode_frames)
    return {"windows": 1, "seconds": plan.seconds, "rows": rows, "ratios": _ratios(rows),
            "encode": encode}  # fmt: skip


async def _browse(browser: Browser, plays: list[Play], plan: Plan) -> list[dict[str, Any]]:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await browser.connect(http)
        rows: list[dict[str, Any]] = []
        for play, transport in zip(plays, TRANSPORTS, strict=True):
            rows += await _transport(http, browser, play, transport, plan)
        return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--tabs", type=int, nargs="+", help="tab counts (default 1 4 16)")
    parser.add_argument("--seconds", type=float, help="measured per size and transport")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    parser.add_argument("--quick", action="store_true", help="1 and 2 tabs, 1.5 s (a smoke run)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    if args.tabs:
        plan = Plan(tuple(args.tabs), plan.seconds, plan.settle_s, plan.encode_frames)
    if args.seconds:
        plan = Plan(plan.tabs, args.seconds, plan.settle_s, plan.encode_frames)
    report.emit(run(plan), TABLES, args.json)


if __name__ == "__main__":
    main()
