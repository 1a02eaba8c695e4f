"""The web server of ``rte play``: the page, its WebRTC offers and WebSockets on 127.0.0.1.

:func:`run` binds the port first (a taken one is one line before anything
starts), launches a daemon or connects to ``name``, serves the gateway's app
(:mod:`rte.play.app`: the page, ``POST /offer`` for WebRTC unless
``transport`` is ``websocket``, ``GET /ws``, ``/recordings/SESSION``), prints
one ready line with the URL, and runs until
SIGTERM, SIGINT or SIGHUP, or until the daemon dies. Then it ends the
sessions' traces (``traces``: :mod:`rte.play.traces`), tells the tabs, closes
their sockets, closes the client (which detaches every session) and
stops a daemon it launched.

Only this machine's pages may open a socket: a request whose Host or Origin
is not this server's (another site in the same browser, a DNS rebinding) is
refused with 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from rte.client import AsyncClient, connect_async
from rte.errors import ConfigurationError, EngineGone
from rte.launch import LaunchedDaemon
from rte.play.app import make_app
from rte.play.daemon import connected, launch
from rte.play.gateway import Gateway

HOST = "127.0.0.1"
INTERRUPTED = 130


@dataclass(frozen=True)
class PlaySettings:
    """What ``rte play`` was asked for (see ``rte play --help``)."""

    name: str | None
    model: str
    port: int
    max_sessions: int
    pace_hz: float
    max_fps: float
    prompt: str
    device: str | None = None
    wait_s: float = 0.0  # for the daemon --name to come up (0: it must be running)
    transport: str = "webrtc"  # or "websocket": the raw fallback alone
    ice_servers: tuple[str, ...] = ()  # STUN/TURN, for peers beyond this machine
    ice_hosts: tuple[str, ...] = (HOST,)  # where WebRTC gathers host candidates
    scale: int = 0  # the video's integer upscale (0: to about 256 px)
    record: Path | None = None  # where recordings go: every session's, or on request
    record_from_start: bool = True  # False: only what POST /recordings/SESSION asks for
    traces: Path | None = None  # where each session's trace goes (rte.play.traces)


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:``port`` (0: a free one)."""
    if not 0 <= port < 65536:
        raise ConfigurationError(f"--port {port}: 0 (a free port) to 65535")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"--port {port}: cannot listen on {HOST}: {exc}") from None
    sock.setblocking(False)
    return sock


def run(settings: PlaySettings) -> int:
    """``rte play``'s body: 0 after SIGTERM, 130 after Ctrl-C; EngineGone when the
    daemon dies (after every tab has been told)."""
    sock = bind(settings.port)
    try:
        code = asyncio.run(_main(settings, sock))
    finally:
        sock.close()
    if code == INTERRUPTED:
        print("rte play: interrupted", file=sys.stderr)
    return code


async def _main(settings: PlaySettings, sock: socket.socket) -> int:
    stop = asyncio.Event()
    got: list[int] = []
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, _stopping, stop, got, sig)
    daemon = None
    try:
        if settings.name is None:
            daemon = launch(
                settings.model, settings.max_sessions, settings.pace_hz, settings.device
            )
        client = await _connected(settings, daemon, stop)
        if client is not None:
            await _serve(settings, client, sock, stop)
    finally:
        if daemon is not None:
            await asyncio.to_thread(daemon.stop)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
    return INTERRUPTED if got and got[0] == signal.SIGINT else 0


def _stopping(stop: asyncio.Event, got: list[int], sig: int) -> None:
    got.append(sig)
    stop.set()


async def _connected(
    settings: PlaySettings, daemon: LaunchedDaemon | None, stop: asyncio.Event
) -> AsyncClient | None:
    """The client, or None when a signal came first."""
    if daemon is not None:
        connecting = asyncio.ensure_future(connected(daemon))
    else:
        assert settings.name is not None
        connecting = asyncio.ensure_future(connect_async(settings.name, settings.wait_s or None))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([connecting, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if connecting.done():
        return connecting.result()
    connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError, EngineGone):
        client = await connecting  # a connect on a thread finishes; close what it made
        await client.close()
    return None


async def _serve(
    settings: PlaySettings, client: AsyncClient, sock: socket.socket, stop: asyncio.Event
) -> None:
    gateway = Gateway(
        client,
        prompt=settings.prompt,
        max_fps=settings.max_fps,
        record=settings.record,
        record_from_start=settings.record_from_start,
        traces=settings.traces,
    )
    port = int(sock.getsockname()[1])
    webrtc = None
    if settings.transport == "webrtc":
        from rte.play.webrtc import WebRtcSettings  # noqa: PLC0415 (aiortc: only for WebRTC)

        webrtc = WebRtcSettings(settings.ice_servers, settings.ice_hosts, settings.scale)
    middlewares = [_this_machine_only(port)]
    app = make_app(gateway, webrtc=webrtc, read=False, middlewares=middlewares)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    reader = asyncio.create_task(gateway.read())
    try:
        await web.SockSite(runner, sock, shutdown_timeout=2.0).start()
        manifest = client.manifest
        print(
            f"rte play: open http://{HOST}:{port}/ (daemon {client.name}, model "
            f"{manifest.model}, {manifest.max_sessions} sessions at most)",
            flush=True,
        )
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(gateway.failed.wait())]
        await asyncio.wait([reader, *waits], return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        if reader.done():
            reader.result()  # a failure of the reader is ours to raise
    finally:
        await gateway.close()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await runner.cleanup()
        await client.close()
    if gateway.gone is not None:
        raise EngineGone(gateway.gone)


def _this_machine_only(port: int) -> Middleware:
    hosts = {f"{HOST}:{port}", f"localhost:{port}"}
    origins = {f"http://{host}" for host in hosts}

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if request.host not in hosts or (origin is not None and origin not in origins):
            raise web.HTTPForbidden(text="rte play serves this machine's pages only\n")
        return await handler(request)

    return check
