"""The gateway of ``rte play``: browser tabs in, one asyncio client of the daemon out.

Each tab's WebSocket is a session of the daemon, attached with one credit
through the gateway's single :class:`~rte.client.AsyncClient`. One reader task
polls the client's batches, copies each row's RGB bytes out, releases the
batch at once and offers the copy to its tab; each tab has a sender task and a
mailbox of one frame (and a few text messages), so a tab whose socket is
behind loses frames (counted) and old messages instead of stalling the reader,
the other tabs or the daemon, and nothing is queued without bound. A tab is
sent at most ``max_fps`` frames a second.

What crosses a tab's socket:

* to the page, binary: :data:`HEADER` (chunk index, the ``seq`` of the page's
  last action this frame is the first after, height, width, the gateway's
  action-to-frame latency in µs or :data:`NO_LATENCY`), then the RGB bytes;
* to the page, text (JSON): ``hello`` (session, daemon, model, prompt, shape),
  ``error`` (a refusal of the daemon's, or of the gateway's), ``gone`` (the
  daemon died: its EngineGone text; the socket closes), ``closed`` (no
  session for this tab, say the arena is full: why; the socket closes),
  ``bye`` (we stop);
* from the page, text (JSON): ``{"move": [dy, dx]}``, ``{"prompt": text}`` or
  ``{"reset": true}``, each with a ``seq``.

A page is not trusted: any message it sends that is not one of those (not
JSON, nested past the decoder's depth, over :data:`MAX_MESSAGE`, binary,
unknown, a field of the wrong type or value) is answered with an ``error``
and changes nothing; the tab and every other tab stream on. Two things end
the one tab's socket, as the WebSocket protocol says they must: a text frame
that is not UTF-8 (close code 1007) and a message over :data:`READ_LIMIT`,
which is never read into memory (1009).

A move lasts while its key is held, and at least until a frame made after it
has come (so a tap moves the scene a step or two, however short it is). The action-to-frame
latency is from an action's arrival at the gateway to the first frame made
(``generated_ns``) after it, measured here when that frame arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMessage, WSMsgType, web

from rte.client import AsyncClient, ChunkBatch, NoticeKind
from rte.errors import ClientClosedError, EngineGone, RequestError, RteError

HEADER = struct.Struct("<IIHHI")  # chunk, ack seq, height, width, latency µs
NO_LATENCY = 0xFFFFFFFF
POLL_S = 0.25  # the reader's longest wait for a batch
MAX_MESSAGE = 64 * 1024  # the largest message a page may send
READ_LIMIT = 16 * 1024 * 1024  # a message up to this is read and refused; past it, 1009
MAX_SAYING = 8  # text messages a tab may have waiting; older ones are dropped
STILL = (0, 0)
log = logging.getLogger("rte.play")


@dataclass
class Tab:
    """One browser tab: its session, its socket, and its mailbox: one frame and
    a few text messages."""

    session: str
    ws: web.WebSocketResponse
    frame: bytes | None = None  # the newest frame not yet sent
    chunk: int = 0
    shape: tuple[int, int] = (0, 0)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    saying: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_SAYING))
    action_ns: int = 0  # arrival of the newest action still waiting for its frame
    action_seq: int = 0
    ack: tuple[int, int] | None = None  # (seq, latency µs) for the next frame sent
    moved_ns: int = 0  # when the current move was sent (0: still)
    after_move: int = 0  # frames made since then
    stop_pending: bool = False  # a key was let go before its move showed
    sent: int = 0
    dropped: int = 0

    def offer(self, frame: bytes, chunk: int, shape: tuple[int, int], generated_ns: int) -> None:
        """The reader's hand-off: the newest frame replaces an unsent one."""
        if self.frame is not None:
            self.dropped += 1
        self.frame, self.chunk, self.shape = frame, chunk, shape
        if self.action_ns and generated_ns > self.action_ns:
            latency_us = min((time.monotonic_ns() - self.action_ns) // 1000, NO_LATENCY - 1)
            self.ack, self.action_ns = (self.action_seq, latency_us), 0
        self.ready.set()

    def say(self, message: dict[str, Any]) -> None:
        """A text message for the page, sent before the next frame."""
        self.saying.append(json.dumps(message))
        self.ready.set()


class Gateway:
    """The tabs of one ``rte play`` over one client of the daemon."""

    def __init__(self, client: AsyncClient, *, prompt: str, max_fps: float) -> None:
        self.client = client
        self.prompt = prompt
        self.period_s = 1.0 / max_fps
        self.tabs: dict[str, Tab] = {}
        self.gone: str | None = None  # the EngineGone text, once the daemon died
        self.closing = False
        self.failed = asyncio.Event()  # set when the daemon died
        self._tasks: set[asyncio.Task[Any]] = set()
        self._opened = 0
        self._id = uuid.uuid4().hex[:4]

    # -- the reader ---------------------------------------------------------------

    async def read(self) -> None:
        """Poll batches until the gateway closes; the daemon's death tells every tab."""
        try:
            while not self.closing:
                batch = await self.client.poll_batch(POLL_S)
                if batch is not None:
                    with batch:
                        self._hand_out(batch)
                self._forward_notices()
        except EngineGone as exc:
            if not self.closing:
                await self._engine_gone(str(exc))
        except ClientClosedError:
            if not self.closing:
                raise

    def _hand_out(self, batch: ChunkBatch) -> None:
        latents, generated = batch.latents, batch.generated_ns
        for i, session in enumerate(batch.sessions):
            tab = self.tabs.get(session)
            if tab is None:
                continue
            frame = latents[i]
            shape = (int(frame.shape[0]), int(frame.shape[1]))
            made = int(generated[i])
            tab.offer(frame.tobytes(), batch.chunk_index(i), shape, made)
            if tab.moved_ns and made > tab.moved_ns:
                tab.after_move += 1
                if tab.stop_pending:
                    tab.stop_pending = False
                    self._spawn(self._move(tab, STILL))

    def _forward_notices(self) -> None:
        for notice in self.client.notices():
            if notice.kind is NoticeKind.ERROR or (
                notice.kind is NoticeKind.DETACHED and notice.message
            ):
                what = "refused" if notice.kind is NoticeKind.ERROR else "detached"
                text = f"{what}: {notice.message}"
                for tab in self._tabs_of(notice.session):
                    tab.say({"type": "error", "message": text})

    def _tabs_of(self, session: str) -> list[Tab]:
        if not session:  # the engine as a whole
            return list(self.tabs.values())
        tab = self.tabs.get(session)
        return [tab] if tab is not None else []

    async def _engine_gone(self, text: str) -> None:
        self.gone = text
        tabs = list(self.tabs.values())
        await asyncio.gather(
            *(_say_and_close(t.ws, {"type": "gone", "message": text}) for t in tabs)
        )
        self.failed.set()

    # -- a tab ---------------------------------------------------------------------

    async def socket(self, request: web.Request) -> web.WebSocketResponse:
        """One tab, from its WebSocket's opening to its close: a session of its own."""
        ws = web.WebSocketResponse(max_msg_size=READ_LIMIT)
        await ws.prepare(request)
        if self.gone is not None or self.closing:
            why = {"type": "gone", "message": self.gone or "rte play is stopping"}
            await _say_and_close(ws, why)
            return ws
        self._opened += 1
        session = f"tab-{self._opened}-{self._id}"
        try:
            await self.client.attach(session, {"prompt": self.prompt, "move": STILL}, credits=1)
        except RteError as exc:  # AdmissionError: the arena is full; EngineGone
            await _say_and_close(ws, {"type": "closed", "message": f"no session: {exc}"})
            return ws
        tab, sender = Tab(session, ws), None
        try:
            manifest = self.client.manifest
            hello = {
                "type": "hello",
                "session": session,
                "daemon": self.client.name,
                "model": manifest.model,
                "prompt": self.prompt,
                "shape": list(manifest.latent_shape),
            }
            await ws.send_json(hello)  # before any frame
            self.tabs[session] = tab
            sender = asyncio.create_task(self._send_frames(tab))
            async for message in ws:
                if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    await self._on_message(tab, message)
        except (ConnectionError, EngineGone, ClientClosedError):
            pass  # the page went, or the daemon did (the reader tells the others)
        finally:
            self.tabs.pop(session, None)
            if sender is not None:
                sender.cancel()
            if not self.closing and self.gone is None:
                with contextlib.suppress(RequestError, EngineGone, ClientClosedError):
                    await self.client.detach(session)
        return ws

    async def _on_message(self, tab: Tab, message: WSMessage) -> None:
        """Do what the page asks, or tell it why not; never end the tab."""
        data = page_request(message)
        if isinstance(data, str):
            tab.say({"type": "error", "message": f"refused: {data}"})
            return
        seq = data.get("seq", 0)
        seq = seq if type(seq) is int and 0 <= seq < NO_LATENCY else 0
        try:
            if "reset" in data:
                if data["reset"] is not True:
                    raise RequestError(f"reset must be true, got {data['reset']!r:.40}")
                await self.client.reset(tab.session)
                tab.moved_ns, tab.stop_pending = 0, False
            elif "move" in data:
                self._arrived(tab, seq)
                await self._steer(tab, data["move"])
            elif "prompt" in data:
                self._arrived(tab, seq)
                await self.client.act(tab.session, {"prompt": data["prompt"]})
            else:
                raise RequestError(f"unknown message: {sorted(data)} (move, prompt or reset)")
        except (EngineGone, ClientClosedError):
            raise  # the reader tells every tab
        except RteError as exc:  # refused here (a value the wire cannot carry), or no room
            tab.say({"type": "error", "message": f"refused: {exc}"})
        except Exception as exc:  # a value the client did not expect: the page's error alone
            log.warning("tab %s: %r refused by %s: %s", tab.session, data, type(exc).__name__, exc)
            tab.say({"type": "error", "message": f"refused: {type(exc).__name__}: {exc}"})

    def _arrived(self, tab: Tab, seq: int) -> None:
        if not tab.action_ns:  # the oldest action still waiting is the one measured
            tab.action_ns, tab.action_seq = time.monotonic_ns(), seq

    async def _steer(self, tab: Tab, move: Any) -> None:
        """Set the move; a stop waits until the move it ends has shown."""
        if isinstance(move, list):
            move = tuple(move)
        if move == STILL and tab.moved_ns and not tab.after_move:
            tab.stop_pending = True
            return
        await self._move(tab, move)

    async def _move(self, tab: Tab, move: Any) -> None:
        with contextlib.suppress(EngineGone, ClientClosedError):  # the reader says so
            await self.client.act(tab.session, {"move": move})
            still = move == STILL
            tab.moved_ns, tab.after_move = (0 if still else time.monotonic_ns()), 0
            tab.stop_pending = False

    async def _send_frames(self, tab: Tab) -> None:
        """The tab's sender: the newest frame, at most one per period; a send that
        waits on a full socket lets the reader replace what waits behind it."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        with contextlib.suppress(ConnectionError, RuntimeError):
            while not tab.ws.closed:
                await tab.ready.wait()
                tab.ready.clear()
                while tab.saying:
                    await tab.ws.send_str(tab.saying.popleft())
                frame, tab.frame = tab.frame, None
                if frame is None:
                    continue
                ack_seq, latency_us = tab.ack or (0, NO_LATENCY)
                tab.ack = None
                height, width = tab.shape
                header = HEADER.pack(tab.chunk, ack_seq, height, width, latency_us)
                await tab.ws.send_bytes(header + frame)
                tab.sent += 1
                due = max(due + self.period_s, loop.time())
                await asyncio.sleep(due - loop.time())

    # -- stopping ------------------------------------------------------------------

    async def close(self) -> None:
        """Tell every tab we stop and close their sockets (their sessions leave
        with the client, which the caller closes next)."""
        self.closing = True
        tabs = list(self.tabs.values())
        await asyncio.gather(*(_say_and_close(t.ws, {"type": "bye"}) for t in tabs))
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, job: Any) -> None:
        task = asyncio.ensure_future(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def page_request(message: WSMessage) -> dict[str, Any] | str:
    """A page's message as the JSON object it should be, or why it is not one."""
    if message.type is not WSMsgType.TEXT:
        return 'a binary message: send JSON text, {"move": [dy, dx]} and the like'
    text = message.data
    if len(text) > MAX_MESSAGE:
        return f"a message of {len(text)} characters: at most {MAX_MESSAGE}"
    try:
        data = json.loads(text)
    except RecursionError:
        return "not JSON this gateway reads: nested too deep"
    except ValueError as exc:
        return f"not JSON: {exc}"
    if not isinstance(data, dict):
        return "not a JSON object"
    return data


async def _send_json(ws: web.WebSocketResponse, message: dict[str, Any]) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        if not ws.closed:
            await ws.send_str(json.dumps(message))


async def _say_and_close(ws: web.WebSocketResponse, message: dict[str, Any]) -> None:
    await _send_json(ws, message)
    with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
        await asyncio.wait_for(ws.close(), 2.0)
