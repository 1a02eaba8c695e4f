"""The gateway of ``rte play``: browser tabs in, one asyncio client of the daemon out.

A tab reaches it over WebRTC (:mod:`rte.play.webrtc`: encoded video, a data
channel) or over a WebSocket (here: raw RGB, the fallback); both are a
:class:`Tab`, whose session, steering, receipts and recording live here, so
the two transports differ only in how a frame and a text leave.

Each tab is a session of the daemon, attached with one credit
through the gateway's single :class:`~rte.client.AsyncClient` (with
``traces``, a recorder of it: :mod:`rte.play.traces`). One reader task
polls the client's batches, copies each row's RGB bytes out, releases the
batch at once and offers the copy to its tab; each tab has a sender (a task,
or the WebRTC track) and a mailbox of one frame (and a few text messages),
so a tab whose socket or encoder is
behind loses frames (counted) and old messages instead of stalling the reader,
the other tabs or the daemon, and nothing is queued without bound. A tab is
sent at most ``max_fps`` frames a second.

What crosses a transport is :mod:`rte.play.websocket`'s and
:mod:`rte.play.webrtc`'s to say; the messages are the same JSON on both: to
the page ``hello`` (session, daemon, model, prompt, shape, transport),
``error`` (a refusal of the daemon's, or of the gateway's), ``gone`` (the
daemon died: its EngineGone text; the tab's transport closes), ``closed`` (no
session for this tab, say the arena is full: why), ``bye`` (we stop); from the
page ``{"move": [dy, dx]}``, ``{"prompt": text}`` or ``{"reset": true}``, each
with a ``seq``.

A page is not trusted: any message it sends that is not one of those (not
JSON, nested past the decoder's depth, over :data:`MAX_MESSAGE`, unknown, a
field of the wrong type or value) is answered with an ``error`` and changes
nothing; the tab and every other tab stream on.

A move lasts while its key is held, and at least until a frame made after it
has come (so a tap moves the scene a step or two, however short it is). Each
act's ``seq`` (the client's) is kept with the page's; a frame's receipt
(``applied``) says which page action it is the first to reflect, and the
action-to-frame latency is from that action's arrival here to that frame's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rte.client import AsyncClient, ChunkBatch, NoticeKind
from rte.errors import ClientClosedError, EngineGone, RequestError, RteError
from rte.play.traces import end_traces, link_of

if TYPE_CHECKING:
    from rte.play.record import Recorder

NO_LATENCY = 0xFFFFFFFF
POLL_S = 0.25  # the reader's longest wait for a batch
MAX_MESSAGE = 64 * 1024  # the largest message a page may send
MAX_SAYING = 8  # text messages a tab may have waiting; older ones are dropped
MAX_WAITING_ACTS = 256  # actions a tab may have waiting for their frame
STILL = (0, 0)
log = logging.getLogger("rte.play")


@dataclass
class Tab:
    """One browser tab: its session, its mailbox (one frame and a few text
    messages), its receipts and its counts; ``end`` says a last message and
    closes its transport, ``tell`` (a data channel's) sends a text at once."""

    session: str
    end: Callable[[dict[str, Any]], Awaitable[None]]
    transport: str = "websocket"
    tell: Callable[[str], None] | None = None  # None: texts wait for the sender
    frame: bytes | None = None  # the newest frame not yet sent
    chunk: int = 0
    shape: tuple[int, int] = (0, 0)
    made_ns: int = 0  # when it began generating (monotonic)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    saying: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_SAYING))
    acts: deque[tuple[int, int, int]] = field(  # (client seq, page seq, arrival ns)
        default_factory=lambda: deque(maxlen=MAX_WAITING_ACTS)
    )
    applied: int = 0  # the newest client seq a frame reflected
    shown_seq: int = 0  # the page's seq of the newest action a frame reflected
    move_seq: int = 0  # the page's seq of the newest move taken (unordered moves)
    ack: tuple[int, int] | None = None  # (seq, latency µs) for the next frame sent
    moved_ns: int = 0  # when the current move was sent (0: still)
    after_move: int = 0  # frames made since then
    stop_pending: bool = False  # a key was let go before its move showed
    stop_seq: tuple[int, int] = (0, 0)  # that stop's page seq and arrival
    sent: int = 0
    dropped: int = 0
    recorder: Recorder | None = None
    recordings: int = 0  # recordings of this session begun so far

    def offer(
        self, frame: bytes, chunk: int, shape: tuple[int, int], made_ns: int, applied: int
    ) -> None:
        """The reader's hand-off: the newest frame replaces an unsent one."""
        if self.frame is not None:
            self.dropped += 1
        self.frame, self.chunk, self.shape, self.made_ns = frame, chunk, shape, made_ns
        if applied > self.applied:
            self.applied = applied
            self._shown()
        self.ready.set()

    def acted(self, client_seq: int, page_seq: int, arrived_ns: int) -> None:
        """An act sent for the page's action ``page_seq``; its frame acks it."""
        self.acts.append((client_seq, page_seq, arrived_ns))
        if client_seq <= self.applied:  # a frame came before ``act`` returned
            self._shown()

    def _shown(self) -> None:
        last = None
        while self.acts and self.acts[0][0] <= self.applied:
            last = self.acts.popleft()
        if last is not None:
            latency_us = min((time.monotonic_ns() - last[2]) // 1000, NO_LATENCY - 1)
            self.shown_seq, self.ack = last[1], (last[1], latency_us)

    def say(self, message: dict[str, Any]) -> None:
        """A text message for the page, sent before the next frame."""
        if self.tell is not None:
            self.tell(json.dumps(message))
            return
        self.saying.append(json.dumps(message))
        self.ready.set()

    def statistics(self) -> dict[str, Any]:
        recorder = self.recorder
        return {
            "session": self.session,
            "transport": self.transport,
            "chunk": self.chunk,
            "sent": self.sent,
            "dropped": self.dropped,
            "recording": None if recorder is None else recorder.statistics(),
        }


class Gateway:
    """The tabs of one ``rte play`` over one client of the daemon."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        prompt: str,
        max_fps: float,
        record: Path | None = None,
        record_from_start: bool = True,
        traces: Path | None = None,
    ) -> None:
        self.client = client
        self.link = link_of(client, traces)  # what it talks through: traces record there
        self.prompt = prompt
        self.period_s = 1.0 / max_fps
        self.record = record  # where recordings go (None: nowhere; the API refuses)
        self.record_from_start = record_from_start  # every new tab's, from its start
        self.record_fps = 30.0  # the MP4's nominal rate (its frames carry their own times)
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
                batch = await self.link.poll_batch(POLL_S)
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
            made, chunk, applied = int(generated[i]), batch.chunk_index(i), batch.applied_of(i)
            data = frame.tobytes()
            tab.offer(data, chunk, shape, made, applied)
            if tab.recorder is not None:
                tab.recorder.frame(data, shape, chunk, tab.shown_seq, made)
            if tab.moved_ns and made > tab.moved_ns:
                tab.after_move += 1
                if tab.stop_pending:
                    tab.stop_pending = False
                    self._spawn(self._move(tab, STILL))

    def _forward_notices(self) -> None:
        for notice in self.link.notices():
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
        await asyncio.gather(*(t.end({"type": "gone", "message": text}) for t in tabs))
        for tab in tabs:
            self.stop_recording(tab)
        self.failed.set()

    # -- a tab ---------------------------------------------------------------------

    def refusal(self) -> dict[str, Any] | None:
        """Why a new tab gets no session now (the daemon died, we stop), or None."""
        if self.gone is not None or self.closing:
            return {"type": "gone", "message": self.gone or "rte play is stopping"}
        return None

    async def open_tab(self, tab: Tab) -> str | None:
        """Attach a session for ``tab`` (named here); why not, if it was refused."""
        self._opened += 1
        tab.session = f"tab-{self._opened}-{self._id}"
        try:
            await self.link.attach(tab.session, {"prompt": self.prompt, "move": STILL}, credits=1)
        except RteError as exc:  # AdmissionError: the arena is full; EngineGone
            return f"no session: {exc}"
        self.tabs[tab.session] = tab
        if self.record is not None and self.record_from_start:
            self.start_recording(tab, self.record)
        return None

    def hello(self, tab: Tab) -> dict[str, Any]:
        manifest = self.client.manifest
        return {
            "type": "hello",
            "session": tab.session,
            "daemon": self.client.name,
            "model": manifest.model,
            "prompt": self.prompt,
            "shape": list(manifest.latent_shape),
            "transport": tab.transport,
        }

    async def close_tab(self, tab: Tab) -> None:
        """The tab went: its session detaches (unless everything is stopping)."""
        if self.tabs.pop(tab.session, None) is None:
            return
        self.stop_recording(tab)
        if not self.closing and self.gone is None:
            with contextlib.suppress(RequestError, EngineGone, ClientClosedError):
                await self.link.detach(tab.session)
        end_traces(self.link, tab.session)  # (a detach ended it; not when stopping)

    async def request(
        self, tab: Tab, data: dict[str, Any] | str, *, unordered: bool = False
    ) -> None:
        """Do what the page asks (a parsed message, or why it is not one), or tell
        it why not; never end the tab. ``unordered``: moves that may arrive out of
        order, of which one older than the newest taken is dropped."""
        if isinstance(data, str):
            tab.say({"type": "error", "message": f"refused: {data}"})
            return
        seq = data.get("seq", 0)
        seq = seq if type(seq) is int and 0 <= seq < NO_LATENCY else 0
        arrived = time.monotonic_ns()
        try:
            if "reset" in data:
                if data["reset"] is not True:
                    raise RequestError(f"reset must be true, got {data['reset']!r:.40}")
                await self.link.reset(tab.session)
                tab.moved_ns, tab.stop_pending = 0, False
            elif "move" in data:
                if unordered and seq and seq <= tab.move_seq:
                    return  # overtaken by a newer move
                tab.move_seq = max(tab.move_seq, seq)
                await self._steer(tab, data["move"], seq, arrived)
            elif "prompt" in data:
                sent = await self.link.act(tab.session, {"prompt": data["prompt"]})
                tab.acted(sent, seq, arrived)
            else:
                raise RequestError(f"unknown message: {sorted(data)} (move, prompt or reset)")
        except (EngineGone, ClientClosedError):
            raise  # the reader tells every tab
        except RteError as exc:  # refused here (a value the wire cannot carry), or no room
            tab.say({"type": "error", "message": f"refused: {exc}"})
            return
        except Exception as exc:  # a value the client did not expect: the page's error alone
            log.warning("tab %s: %r refused by %s: %s", tab.session, data, type(exc).__name__, exc)
            tab.say({"type": "error", "message": f"refused: {type(exc).__name__}: {exc}"})
            return
        if tab.recorder is not None:
            tab.recorder.action(data, tab.chunk)

    async def _steer(self, tab: Tab, move: Any, seq: int = 0, arrived: int = 0) -> None:
        """Set the move; a stop waits until the move it ends has shown."""
        if isinstance(move, list):
            move = tuple(move)
        if move == STILL and tab.moved_ns and not tab.after_move:
            tab.stop_pending, tab.stop_seq = True, (seq, arrived)
            return
        await self._move(tab, move, seq, arrived)

    async def _move(self, tab: Tab, move: Any, seq: int = 0, arrived: int = 0) -> None:
        with contextlib.suppress(EngineGone, ClientClosedError):  # the reader says so
            if not seq and tab.stop_pending:  # the stop deferred till its move showed
                seq, arrived = tab.stop_seq
            sent = await self.link.act(tab.session, {"move": move})
            tab.acted(sent, seq, arrived or time.monotonic_ns())
            still = move == STILL
            tab.moved_ns, tab.after_move = (0 if still else time.monotonic_ns()), 0
            tab.stop_pending = False

    # -- recording -----------------------------------------------------------------

    def start_recording(self, tab: Tab | str, directory: Path | None = None) -> Path:
        """Record a tab's session (a tab, or its session's name) to ``directory``
        (default: the gateway's ``record``); the MP4's path (see :mod:`rte.play.record`):
        ``SESSION.mp4``, then ``SESSION-2.mp4``... A recording running goes on."""
        from rte.play.record import Recorder  # noqa: PLC0415 (PyAV: only to record)

        tab = self._tab(tab)
        directory = directory or self.record
        if directory is None:
            raise RequestError(f"no directory to record {tab.session!r} to: give one")
        if tab.recorder is None:
            tab.recordings += 1
            name = tab.session if tab.recordings == 1 else f"{tab.session}-{tab.recordings}"
            tab.recorder = Recorder(directory, name, fps=self.record_fps)
        return tab.recorder.path

    def stop_recording(self, tab: Tab | str) -> Recorder | None:
        """Finish a tab's recording, if any (its writer ends on a thread of its own:
        :meth:`~rte.play.record.Recorder.wait` for it); that recorder, or None."""
        tab = self._tab(tab)
        recorder, tab.recorder = tab.recorder, None
        if recorder is not None:
            recorder.close()
        return recorder

    def _tab(self, tab: Tab | str) -> Tab:
        if isinstance(tab, Tab):
            return tab
        if (found := self.tabs.get(tab)) is None:
            raise RequestError(f"no tab of session {tab!r} here: {sorted(self.tabs)}")
        return found

    # -- stopping ------------------------------------------------------------------

    async def close(self) -> None:
        """Tell every tab we stop and close their sockets (their sessions leave
        with the client, which the caller closes next)."""
        self.closing = True
        end_traces(self.link)  # first: whatever happens next, they are whole
        tabs = list(self.tabs.values())
        await asyncio.gather(*(t.end({"type": "bye"}) for t in tabs))
        for tab in tabs:
            self.stop_recording(tab)
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, job: Any) -> None:
        task = asyncio.ensure_future(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def made_wall_ms(made_ns: int) -> int:
    """A monotonic ``made_ns`` as the wall-clock millisecond mod 2**32 (a page's clock)."""
    return ((time.time_ns() - (time.monotonic_ns() - made_ns)) // 1_000_000) & 0xFFFFFFFF


def page_text(text: str) -> dict[str, Any] | str:
    """A page's text message as the JSON object it should be, or why it is not one."""
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
