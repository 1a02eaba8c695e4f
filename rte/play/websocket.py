"""The WebSocket transport of ``rte play``: raw RGB frames, the fallback.

``GET /ws`` is a tab (:func:`socket_handler`); its session, steering and
receipts are the :class:`~rte.play.gateway.Gateway`'s. A sender task sends
the tab's newest frame, at most one per period; a send that waits on a full
socket lets the reader replace what waits behind it (counted as dropped).

What crosses a tab's socket:

* to the page, binary: :data:`HEADER` (chunk index, the ``seq`` of the page's
  last action this frame is the first to reflect, height, width, the gateway's
  action-to-frame latency in µs or :data:`~rte.play.gateway.NO_LATENCY`, the
  wall-clock millisecond, mod 2**32, the frame began generating, as the WebRTC
  stamp says it: the page's frame age), then the RGB bytes;
* to the page, text: the gateway's JSON messages (``hello``, ``error``,
  ``gone``, ``closed``, ``bye``); after ``gone``, ``closed`` and ``bye`` the
  socket closes;
* from the page, text: the JSON of a move, a prompt or a reset. A binary
  message is answered with an ``error``. Two things end the one tab's socket,
  as the WebSocket protocol says they must: a text frame that is not UTF-8
  (close code 1007) and a message over :data:`READ_LIMIT`, which is never read
  into memory (1009).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSMessage, WSMsgType, web

from rte.errors import ClientClosedError, EngineGone
from rte.play.gateway import NO_LATENCY, Gateway, Tab, made_wall_ms, page_text

HEADER = struct.Struct("<IIHHII")  # chunk, ack seq, height, width, latency µs, made ms
READ_LIMIT = 16 * 1024 * 1024  # a message up to this is read and refused; past it, 1009


def socket_handler(
    gateway: Gateway,
) -> Callable[[web.Request], Awaitable[web.WebSocketResponse]]:
    """The ``GET /ws`` handler of ``gateway``."""

    async def socket(request: web.Request) -> web.WebSocketResponse:
        """One tab, from its WebSocket's opening to its close: a session of its own."""
        ws = web.WebSocketResponse(max_msg_size=READ_LIMIT)
        await ws.prepare(request)
        if (refusal := gateway.refusal()) is not None:
            await say_and_close(ws, refusal)
            return ws

        async def end(message: dict[str, Any]) -> None:
            await say_and_close(ws, message)

        tab, sender = Tab("", end), None
        if (why := await gateway.open_tab(tab)) is not None:
            await say_and_close(ws, {"type": "closed", "message": why})
            return ws
        try:
            await ws.send_json(gateway.hello(tab))  # before any frame
            sender = asyncio.create_task(_send_frames(tab, ws, gateway.period_s))
            async for message in ws:
                if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    await gateway.request(tab, page_request(message))
        except (ConnectionError, EngineGone, ClientClosedError):
            pass  # the page went, or the daemon did (the reader tells the others)
        finally:
            if sender is not None:
                sender.cancel()
            await gateway.close_tab(tab)
        return ws

    return socket


async def _send_frames(tab: Tab, ws: web.WebSocketResponse, period_s: float) -> None:
    """The tab's sender: the newest frame, at most one per period."""
    loop = asyncio.get_running_loop()
    due = loop.time()
    with contextlib.suppress(ConnectionError, RuntimeError):
        while not ws.closed:
            await tab.ready.wait()
            tab.ready.clear()
            while tab.saying:
                await ws.send_str(tab.saying.popleft())
            frame, tab.frame = tab.frame, None
            if frame is None:
                continue
            ack_seq, latency_us = tab.ack or (0, NO_LATENCY)
            tab.ack = None
            height, width = tab.shape
            made_ms = made_wall_ms(tab.made_ns)
            header = HEADER.pack(tab.chunk, ack_seq, height, width, latency_us, made_ms)
            await ws.send_bytes(header + frame)
            tab.sent += 1
            due = max(due + period_s, loop.time())
            await asyncio.sleep(due - loop.time())


def page_request(message: WSMessage) -> dict[str, Any] | str:
    """A page's message as the JSON object it should be, or why it is not one."""
    if message.type is not WSMsgType.TEXT:
        return 'a binary message: send JSON text, {"move": [dy, dx]} and the like'
    return page_text(message.data)


async def say_and_close(ws: web.WebSocketResponse, message: dict[str, Any]) -> None:
    """Send ``message`` (if the socket is open) and close it."""
    with contextlib.suppress(ConnectionError, RuntimeError):
        if not ws.closed:
            await ws.send_str(json.dumps(message))
    with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
        await asyncio.wait_for(ws.close(), 2.0)
