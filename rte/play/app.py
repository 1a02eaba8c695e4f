"""The embeddable gateway: an aiohttp application of ``rte play``'s routes.

    from aiohttp import web
    from rte.client import connect_async
    from rte.play.app import make_app
    from rte.play.gateway import Gateway, Tab

    async def app() -> web.Application:
        client = await connect_async("mydaemon")
        gateway = Gateway(client, prompt="a forest", max_fps=60)
        return make_app(gateway)             # reads the daemon while it runs

    web.run_app(app(), host="127.0.0.1", port=8000)

Its routes: ``GET /`` the page, ``GET /config`` the transport it offers and
the ICE servers for the page, ``POST /offer`` a tab over WebRTC
(:mod:`rte.play.webrtc`; absent with ``webrtc=None``), ``GET /ws`` a tab over
a WebSocket (:mod:`rte.play.websocket`), ``GET /stats`` each tab's counts
(frames sent and dropped, its recording's), ``POST /recordings/SESSION``
starts recording a tab's session into the gateway's ``record`` directory
(201: the MP4's and sidecar's paths) and ``DELETE /recordings/SESSION`` stops
it (200 once the file is finished: its frames, drops, path; see
:mod:`rte.play.record`). Each refusal is JSON ``{"error": why}``: 404 for a
session with no tab here, 409 for a start while recording, a stop while not,
or a gateway given no directory. The page uses relative URLs, so
the app may be mounted under a prefix (``add_subapp``). With ``read=True`` the
app runs the gateway's reader from its startup and closes the gateway (and
the client) at its cleanup; ``rte play`` does both itself. A gateway made with
``traces=DIR`` records each tab's trace (:mod:`rte.play.traces`); closing it
ends them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from rte.play.gateway import Gateway, Tab
from rte.play.websocket import socket_handler

if TYPE_CHECKING:
    from rte.play.webrtc import WebRtcSettings

GATEWAY = web.AppKey("gateway", Gateway)
FINISH_S = 10.0  # a stop waits this long for the writer to finish the file


def page() -> bytes:
    """The page: one HTML file with its script and style inline."""
    return resources.files("rte.play").joinpath("page.html").read_bytes()


def make_app(
    gateway: Gateway,
    *,
    webrtc: WebRtcSettings | bool | None = True,
    read: bool = True,
    middlewares: Sequence[Middleware] = (),
) -> web.Application:
    """The routes of ``gateway``; ``webrtc``: a
    :class:`~rte.play.webrtc.WebRtcSettings` (True: its defaults; None or False:
    the WebSocket transport only, and aiortc is not imported)."""
    html = page()

    async def index(request: web.Request) -> web.Response:
        return web.Response(body=html, content_type="text/html", charset="utf-8")

    async def stats(request: web.Request) -> web.Response:
        tabs = [tab.statistics() for tab in gateway.tabs.values()]
        for tab in tabs:
            if tab["recording"] is not None:
                tab["recording"] = vars(tab["recording"])
        return web.json_response({"daemon": gateway.client.name, "tabs": tabs})

    app = web.Application(middlewares=list(middlewares))
    app[GATEWAY] = gateway
    app.router.add_get("/", index)
    app.router.add_get("/ws", socket_handler(gateway))
    app.router.add_get("/stats", stats)
    app.router.add_post("/recordings/{session}", _start_recording)
    app.router.add_delete("/recordings/{session}", _stop_recording)
    config: dict[str, Any] = {"transport": "websocket"}
    if webrtc is not None and webrtc is not False:
        from rte.play import webrtc as rtc  # noqa: PLC0415 (aiortc: only for WebRTC)

        settings = webrtc if isinstance(webrtc, rtc.WebRtcSettings) else rtc.WebRtcSettings()
        app.router.add_post("/offer", rtc.offer_handler(gateway, settings))
        config = {"transport": "webrtc", "iceServers": settings.browser_ice_servers()}

    async def configuration(request: web.Request) -> web.Response:
        return web.json_response(config)

    app.router.add_get("/config", configuration)
    if read:
        app.cleanup_ctx.append(_reading)
    return app


def _refused(status: int, why: str) -> web.Response:
    return web.json_response({"error": why}, status=status)


def _recorded_tab(request: web.Request) -> tuple[Gateway, Tab | web.Response]:
    """The tab of the request's session, or the 404 that says there is none."""
    gateway, session = request.app[GATEWAY], request.match_info["session"]
    tab = gateway.tabs.get(session)
    if tab is None:
        return gateway, _refused(
            404,
            f"no tab of session {session!r} here (closed, or never opened): GET stats lists them",
        )
    return gateway, tab


async def _start_recording(request: web.Request) -> web.Response:
    gateway, tab = _recorded_tab(request)
    if not isinstance(tab, Tab):
        return tab
    if gateway.record is None:
        return _refused(
            409, "this gateway records nowhere: start it with a directory (--record DIR)"
        )
    if tab.recorder is not None:
        return _refused(
            409,
            f"session {tab.session!r} is already recording to {tab.recorder.path}: "
            f"DELETE recordings/{tab.session} stops it",
        )
    path = gateway.start_recording(tab)
    sidecar = str(path.with_suffix(".jsonl"))
    return web.json_response(
        {"session": tab.session, "path": str(path), "sidecar": sidecar}, status=201
    )


async def _stop_recording(request: web.Request) -> web.Response:
    gateway, tab = _recorded_tab(request)
    if not isinstance(tab, Tab):
        return tab
    recorder = gateway.stop_recording(tab)
    if recorder is None:
        return _refused(
            409,
            f"session {tab.session!r} is not recording: POST recordings/{tab.session} starts it",
        )
    await asyncio.to_thread(recorder.wait, FINISH_S)
    return web.json_response({"session": tab.session, **vars(recorder.statistics())})


async def _reading(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY]
    reader = asyncio.create_task(gateway.read())
    yield
    await gateway.close()
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    await gateway.client.close()
