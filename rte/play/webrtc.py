"""The WebRTC transport of ``rte play``: encoded video out, a data channel in.

``POST /offer`` takes a page's SDP offer (non-trickle: the page waits for its
ICE gathering) and answers with aiortc's: a peer connection per tab, a
session of the daemon per peer (the :class:`~rte.play.gateway.Gateway`'s).
Its video track (:class:`SessionTrack`) is the tab's frames, upscaled and
stamped (:mod:`rte.play.picture`) and encoded by aiortc (VP8 or H.264 through
PyAV, whichever the page prefers) at the daemon's pace.

Latest frame wins, end to end: the reader puts a tab's newest frame in its
mailbox of one; aiortc asks the track for a frame only when it has encoded and
sent the one before, and the track hands it whatever is newest then, so a
slow encoder drops frames (counted per tab) and nothing grows. The page says
which frame it displayed (``{"shown": chunk}`` on ``moves``, from its
``requestVideoFrameCallback``), and the track sends nothing while the oldest
frame the page has not shown left more than :data:`MAX_LAG_S` ago, but a
probe every :data:`PROBE_S`: a stalled viewer (a stopped renderer, a slow
link) is sent no backlog that it would have to play through late, only the
newest frame once it shows frames again. A peer the page has not spoken to
for :data:`SILENT_S` (it sends ``{"alive": true}`` every :data:`ALIVE_S`) is closed
and its session detached: a closed tab says nothing to its peer.

A viewer back from a stall would still show frames late for seconds: the few
frames sent before the gateway saw it behind arrive in a burst, and Chromium's
jitter buffer learns their delay and gives it back at about 100 ms a second.
So the page, when its own timer skipped a second (it did not run) or it is
shown again after a second hidden, sends ``{"renegotiate": SDP}`` on
``control``: its offer with one more ``recvonly`` video m-line. The gateway
puts a fresh :class:`SessionTrack` on it (a new SSRC: a new receive stream that
never saw the stall), answers ``{"type": "answer", "sdp": ...}`` and stops the
old track; an offer it cannot take is an ``error`` and the old track streams on
(at most :data:`MAX_RESTARTS` a peer, one at a time).

The page opens two data channels: ``control`` (ordered, reliable: prompts,
resets, and the gateway's messages to it, ``hello``, ``ack`` with the
gateway's action-to-frame latency, ``error``, ``gone``, ``bye``) and
``moves`` (unordered: a move older than the newest one taken is dropped, as
the keys' state is what counts). What a channel brings waits in a bounded
queue (:data:`MAX_PENDING`); past it the page gets an ``error``.

ICE gathers host candidates only on :attr:`WebRtcSettings.hosts` (default
127.0.0.1: aioice would skip loopback and take every other interface), and
uses STUN/TURN servers only when given; a gateway on loopback alone ignores a
page's candidates elsewhere, so nothing but this machine is contacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from fractions import Fraction
from ipaddress import ip_address
from typing import Any

import aioice.ice
import numpy as np
from aiohttp import web
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError
from av import VideoFrame

from rte.errors import ClientClosedError, ConfigurationError, EngineGone
from rte.play.gateway import MAX_SAYING, Gateway, Tab, made_wall_ms, page_text
from rte.play.picture import scale_for, stamped

VIDEO_CLOCK = 90_000  # RTP's video clock, Hz
CONNECT_TIMEOUT_S = 20.0  # a peer not connected by then is closed (its page went)
MAX_PENDING = 64  # a channel's messages waiting for the gateway, at most
MAX_BUFFERED = 256 * 1024  # a control channel this far behind drops what is said
MAX_OFFER = 64 * 1024
MAX_LAG_S = 0.25  # frames sent and not shown for this long: the viewer is behind
PROBE_S = 5.0  # a viewer behind is sent a frame this often, to see it come back
ALIVE_S = 0.25  # the page's heartbeat period
SILENT_S = 8.0  # a page silent this long has gone
MAX_RESTARTS = 64  # fresh video tracks a peer may ask for (each adds an m-line)


@dataclass(frozen=True)
class WebRtcSettings:
    """How tabs connect: ``ice_servers`` (``URL`` or ``URL,USERNAME,CREDENTIAL``,
    STUN or TURN, none by default) and ``hosts``, the local addresses ICE gathers
    host candidates on; ``scale``: the integer upscale (0: to about 256 px)."""

    ice_servers: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ("127.0.0.1",)
    scale: int = 0

    def _servers(self) -> list[tuple[str, str | None, str | None]]:
        servers: list[tuple[str, str | None, str | None]] = []
        for server in self.ice_servers:
            url, *login = server.split(",")
            if not url.startswith(("stun:", "turn:", "turns:")) or len(login) not in (0, 2):
                raise ConfigurationError(
                    f"--ice-server {server!r}: stun:HOST[:PORT] or turn:HOST[:PORT],USER,PASSWORD"
                )
            servers.append((url, *login) if login else (url, None, None))  # type: ignore[arg-type]
        return servers

    def configuration(self) -> RTCConfiguration:
        servers = [RTCIceServer(u, username=n, credential=c) for u, n, c in self._servers()]
        return RTCConfiguration(iceServers=servers)

    def browser_ice_servers(self) -> list[dict[str, str]]:
        """The same servers as a page's ``RTCPeerConnection`` takes them."""
        servers = []
        for url, username, credential in self._servers():
            server = {"urls": url}
            if username is not None and credential is not None:
                server |= {"username": username, "credential": credential}
            servers.append(server)
        return servers

    def loopback_only(self) -> bool:
        return all(ip_address(host).is_loopback for host in self.hosts)

    def check(self) -> None:
        """A clear error now for a setting that could not work later."""
        for host in self.hosts:
            try:
                ip_address(host)
            except ValueError:
                raise ConfigurationError(f"--ice-host {host!r}: an IP address") from None
        if self.scale < 0:
            raise ConfigurationError(f"--scale {self.scale}: 0 (automatic) or more")
        self.configuration()


def gather_on(hosts: tuple[str, ...]) -> None:
    """Make aioice gather host candidates on ``hosts`` alone (process-wide)."""

    def addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [h for h in hosts if (use_ipv6 if ":" in h else use_ipv4)]

    aioice.ice.get_host_addresses = addresses


def local_candidates_only(sdp: str) -> str:
    """``sdp`` without the candidates that are not on loopback (mDNS names included)."""
    lines = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            parts = line.split()
            try:
                if len(parts) < 5 or not ip_address(parts[4]).is_loopback:
                    continue
            except ValueError:  # a name, such as an mDNS one
                continue
        lines.append(line)
    return "\r\n".join(lines) + "\r\n"


class SessionTrack(MediaStreamTrack):
    """A tab's frames as video: the newest frame each time the encoder asks."""

    kind = "video"

    def __init__(self, tab: Tab, scale: int, period_s: float) -> None:
        super().__init__()
        self.tab, self.scale, self.period_s = tab, scale, period_s
        self._start = time.monotonic()
        self._due = 0.0
        self.unshown: deque[tuple[int, float]] = deque(maxlen=256)  # (chunk, sent at)
        self._probed = 0.0
        self._shown = asyncio.Event()

    def shown(self, chunk: int) -> None:
        """The page displayed ``chunk``: it and every frame before it are done."""
        while self.unshown and self.unshown[0][0] <= chunk:
            self.unshown.popleft()
        self._shown.set()

    def alive(self) -> None:
        """The page's heartbeat: a viewer behind for longer than a heartbeat's
        period (stopped, then back) starts afresh from the newest frame."""
        if self.unshown and time.monotonic() - self.unshown[-1][1] > ALIVE_S:
            self.unshown.clear()
            self._shown.set()

    def _behind(self, now: float) -> bool:
        return bool(self.unshown) and now - self.unshown[0][1] > MAX_LAG_S

    async def recv(self) -> VideoFrame:
        tab = self.tab
        loop = asyncio.get_running_loop()
        if (wait := self._due - loop.time()) > 0:
            await asyncio.sleep(wait)
        while True:
            while tab.frame is None:
                tab.ready.clear()
                await tab.ready.wait()
            if self.readyState != "live":  # replaced by a fresh track: leave it the frame
                raise MediaStreamError
            now = time.monotonic()
            if not self._behind(now) or now - self._probed > PROBE_S:
                break
            self._shown.clear()  # the viewer is behind: the reader replaces the frame
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._shown.wait(), self.period_s)
        if self._behind(now):
            self._probed = now
        frame, tab.frame = tab.frame, None
        self.unshown.append((tab.chunk, now))
        self._due = max(self._due + self.period_s, loop.time())
        height, width = tab.shape
        rgb = np.frombuffer(frame, np.uint8).reshape(height, width, 3)
        scale = self.scale or scale_for(tab.shape)
        picture = stamped(rgb, scale, tab.chunk, tab.shown_seq, made_wall_ms(tab.made_ns))
        video = VideoFrame.from_ndarray(picture, format="rgb24")
        video.pts = int((time.monotonic() - self._start) * VIDEO_CLOCK)
        video.time_base = Fraction(1, VIDEO_CLOCK)
        tab.sent += 1
        if tab.ack is not None:
            seq, latency_us = tab.ack
            tab.ack = None
            tab.say({"type": "ack", "seq": seq, "gateway_ms": latency_us / 1000})
        return video


class Peer:
    """One tab's peer connection: its channels in, its track and texts out."""

    def __init__(self, gateway: Gateway, settings: WebRtcSettings) -> None:
        self.gateway = gateway
        self.settings = settings
        self.pc = RTCPeerConnection(settings.configuration())
        self.restarts = 0  # fresh video tracks the page asked for (after a stall)
        self._restarting = False
        self.control: RTCDataChannel | None = None
        self.unsaid: deque[str] = deque(maxlen=MAX_SAYING)  # before the channel opened
        self.tab = Tab("", self.end, transport="webrtc", tell=self.tell)
        self.pending: asyncio.Queue[tuple[str, bool]] = asyncio.Queue(MAX_PENDING)
        self.track: SessionTrack | None = None
        self.heard = time.monotonic()  # when the page last said anything
        self.closed = False
        self._tasks: list[asyncio.Task[Any]] = []
        self.pc.on("datachannel", self._channel)
        self.pc.on("connectionstatechange", self._state)

    def tell(self, text: str) -> None:
        channel = self.control
        if channel is None or channel.readyState != "open":
            self.unsaid.append(text)
        elif channel.bufferedAmount < MAX_BUFFERED:
            channel.send(text)

    async def end(self, message: dict[str, Any]) -> None:
        """Say ``message`` last and close the connection."""
        self.tell(json.dumps(message))
        channel, deadline = self.control, time.monotonic() + 1.0
        while channel is not None and channel.bufferedAmount and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # the SCTP chunk on its way before the ABORT
        await self.close()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for task in self._tasks:
            task.cancel()
        await self.gateway.close_tab(self.tab)
        with contextlib.suppress(Exception):  # aiortc's own teardown of a broken peer
            await self.pc.close()

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._take_requests()))
        self._tasks.append(asyncio.create_task(self._connected_in_time()))

    def _channel(self, channel: RTCDataChannel) -> None:
        unordered = channel.label == "moves"
        if channel.label == "control":
            self.control = channel
            self.tell(json.dumps(self.gateway.hello(self.tab)))
            while self.unsaid:
                self.tell(self.unsaid.popleft())
            channel.on("close", lambda: asyncio.ensure_future(self.close()))

        def on_message(message: str | bytes) -> None:
            self.heard = time.monotonic()
            if isinstance(message, str) and message.startswith('{"renegotiate"'):
                self._tasks.append(asyncio.create_task(self._restart_video(message)))
                return
            if isinstance(message, str) and message.startswith(('{"shown"', '{"alive"')):
                said = page_text(message)
                if self.track is None or not isinstance(said, dict):
                    return
                if type(said.get("shown")) is int:
                    self.track.shown(said["shown"])
                elif said.get("alive") is True:
                    self.track.alive()
                return
            try:
                self.pending.put_nowait(
                    (message if isinstance(message, str) else "\x00binary", unordered)
                )
            except asyncio.QueueFull:
                self.tab.say({"type": "error", "message": "refused: too many messages at once"})

        channel.on("message", on_message)

    async def _restart_video(self, text: str) -> None:
        """The page's new offer, one more video m-line: a fresh track on it (a new
        SSRC, so a new receive stream whose jitter buffer never saw the stall), the
        old track stopped; the answer goes back on ``control``."""
        said = page_text(text)
        sdp = said.get("renegotiate") if isinstance(said, dict) else None
        if self._restarting or self.restarts >= MAX_RESTARTS or not isinstance(sdp, str):
            why = f"at most {MAX_RESTARTS}, one at a time, an SDP string"
            self.tab.say({"type": "error", "message": f"refused: a video restart: {why}"})
            return
        videos = sum(t.kind == "video" for t in self.pc.getTransceivers())
        if sdp.count("\nm=video ") != videos + 1:
            why = f"the offer must add one video m-line to the {videos} there are"
            self.tab.say({"type": "error", "message": f"refused: a video restart: {why}"})
            return
        self._restarting, self.restarts = True, self.restarts + 1
        old = self.track
        try:
            if self.settings.loopback_only():
                sdp = local_candidates_only(sdp)
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            track = SessionTrack(self.tab, self.settings.scale, self.gateway.period_s)
            self.pc.addTrack(track)
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except Exception as exc:  # aiortc's word on an offer it cannot take: the old track goes on
            self.tab.say({"type": "error", "message": f"refused: a video restart: {exc}"})
            return
        finally:
            self._restarting = False
        self.track = track
        if old is not None:
            old.stop()
        answer = self.pc.localDescription
        self.tell(json.dumps({"type": "answer", "sdp": answer.sdp}))

    async def _take_requests(self) -> None:
        with contextlib.suppress(EngineGone, ClientClosedError):
            while True:
                text, unordered = await self.pending.get()
                data = (
                    'a binary message: send JSON text, {"move": [dy, dx]} and the like'
                    if text == "\x00binary"
                    else page_text(text)
                )
                await self.gateway.request(self.tab, data, unordered=unordered)

    async def _state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            await self.close()

    async def _connected_in_time(self) -> None:
        """Close a peer that does not connect in time, or whose page went silent."""
        started = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            if self.pc.connectionState != "connected":
                if now - started > CONNECT_TIMEOUT_S:
                    break
            elif now - self.heard > SILENT_S:
                break
        await self.close()


def offer_handler(
    gateway: Gateway, settings: WebRtcSettings
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The ``POST /offer`` handler of ``gateway``: an SDP offer in, the answer out."""
    settings.check()
    gather_on(settings.hosts)

    async def offer(request: web.Request) -> web.Response:
        body = await request.content.read(MAX_OFFER + 1)
        try:
            data = json.loads(body) if len(body) <= MAX_OFFER else None
        except ValueError:
            data = None
        if not isinstance(data, dict) or data.get("type") != "offer":
            raise web.HTTPBadRequest(text='send {"type": "offer", "sdp": ...}, at most 64 KiB\n')
        sdp = data.get("sdp")
        if not isinstance(sdp, str) or "m=video" not in sdp:
            raise web.HTTPBadRequest(text="the offer must have a video m-line to receive on\n")
        if (refusal := gateway.refusal()) is not None:
            return web.json_response(refusal, status=503)
        peer = Peer(gateway, settings)
        if (why := await gateway.open_tab(peer.tab)) is not None:
            await peer.pc.close()
            return web.json_response({"type": "closed", "message": why}, status=503)
        if settings.loopback_only():
            sdp = local_candidates_only(sdp)
        try:
            await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            track = peer.track = SessionTrack(peer.tab, settings.scale, gateway.period_s)
            for transceiver in peer.pc.getTransceivers():
                if transceiver.kind == "video":
                    peer.pc.addTrack(track)
                    break
            await peer.pc.setLocalDescription(await peer.pc.createAnswer())
        except (ValueError, RuntimeError) as exc:  # aiortc's word on an offer it cannot take
            await peer.close()
            raise web.HTTPBadRequest(text=f"offer refused: {exc}\n") from None
        peer.start()
        answer = peer.pc.localDescription
        return web.json_response({"type": answer.type, "sdp": answer.sdp})

    return offer
