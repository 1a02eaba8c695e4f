"""Recording a session: an MP4 of its frames and a JSON-lines sidecar.

``rte play --record DIR`` (every tab from its start), ``POST /recordings/SESSION``
(:mod:`rte.play.app`) or :meth:`rte.play.gateway.Gateway.start_recording` gives
a tab's session a :class:`Recorder`: ``DIR/SESSION.mp4`` (H.264 through PyAV,
each frame upscaled as the video is, timed by when the daemon began
generating it; a later recording of the same session is ``SESSION-2.mp4`` and
so on) and ``DIR/SESSION.jsonl``, one JSON object a line:

* ``{"frame": n, "chunk": c, "seq": s, "ms": t}``: the n-th frame of the MP4
  is chunk ``c`` of the session, reflecting the page's action ``s``, at ``t``
  ms into the recording;
* ``{"action": {...}, "chunk": c}``: what the page asked for (a move, a prompt,
  a reset), taken when the session's newest frame was chunk ``c``;
* last, ``{"end": true, "frames": n, "dropped": d}``.

The live stream never waits for the recording: the gateway's loop only puts
into a bounded queue (:data:`QUEUE_ITEMS`), and a recorder whose writer
thread is behind drops what does not fit and counts it (``dropped``); the
writer encodes and writes on a thread of its own.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from rte.errors import ConfigurationError
from rte.play.picture import scale_for, upscale

QUEUE_ITEMS = 64  # frames and actions waiting for the writer, at most
CODEC = "libx264"
TIME_BASE = Fraction(1, 1000)
log = logging.getLogger("rte.play")


@dataclass(frozen=True)
class RecordingStatistics:
    path: str
    frames: int  # written to the MP4
    dropped: int  # frames and actions the queue had no room for
    done: bool  # the writer finished the file
    error: str | None  # why it stopped early, if it did


class Recorder:
    """One session's recording, written on a thread of its own."""

    def __init__(self, directory: Path, name: str, *, fps: float = 30.0) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(f"--record {directory}: cannot make it: {exc}") from None
        self.path = directory / f"{name}.mp4"
        self.sidecar = directory / f"{name}.jsonl"
        self.fps = fps
        self.frames = 0
        self.dropped = 0
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue(QUEUE_ITEMS)
        self._closed = False
        self.error: str | None = None  # why the writer stopped early
        self._done = threading.Event()
        self._writer = threading.Thread(target=self._write, name=f"record-{name}", daemon=True)
        self._writer.start()

    # -- the gateway's side: never waits ----------------------------------------------

    def frame(
        self, data: bytes, shape: tuple[int, int], chunk: int, seq: int, made_ns: int
    ) -> None:
        """A frame of the session (its RGB bytes), or a count if there is no room."""
        self._put(("frame", (data, shape, chunk, seq, made_ns)))

    def action(self, request: dict[str, Any], chunk: int) -> None:
        """What the page asked for, at the session's newest chunk."""
        self._put(("action", (request, chunk)))

    def close(self) -> None:
        """No more: the writer finishes the file (see :meth:`wait`)."""
        if not self._closed:
            self._closed = True
            self._put(None, always=True)

    def wait(self, timeout: float) -> bool:
        """Whether the writer finished within ``timeout`` s."""
        return self._done.wait(timeout)

    def statistics(self) -> RecordingStatistics:
        return RecordingStatistics(
            str(self.path), self.frames, self.dropped, self._done.is_set(), self.error
        )

    def _put(self, item: tuple[str, Any] | None, always: bool = False) -> None:
        if self._closed and not always:
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            if item is None:  # the end must get in: make room by dropping the oldest
                with self._queue.mutex:
                    self._queue.queue.popleft()
                self.dropped += 1
                self._queue.put_nowait(None)
            else:
                self.dropped += 1

    # -- the writer's thread ------------------------------------------------------------

    def _write(self) -> None:
        try:
            self._encode()
        except Exception as exc:  # the recording ends; the stream goes on
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("recording %s stopped: %s", self.path, self.error)

    def _encode(self) -> None:
        container: Any = None
        stream: Any = None
        first_ns, last_ms = -1, -1
        try:
            with self.sidecar.open("w") as sidecar:
                while (item := self._queue.get()) is not None:
                    kind, value = item
                    if kind == "action":
                        request, chunk = value
                        sidecar.write(json.dumps({"action": request, "chunk": chunk}) + "\n")
                        continue
                    data, shape, chunk, seq, made_ns = value
                    scale = scale_for(shape)
                    picture = upscale(np.frombuffer(data, np.uint8).reshape(*shape, 3), scale)
                    if container is None:
                        container = av.open(str(self.path), "w")
                        stream = container.add_stream(CODEC, rate=round(self.fps) or 30)
                        stream.height, stream.width = picture.shape[0], picture.shape[1]
                        stream.pix_fmt = "yuv420p"
                        stream.time_base = stream.codec_context.time_base = TIME_BASE
                        stream.options = {"preset": "veryfast", "crf": "12", "bf": "0"}
                    video = av.VideoFrame.from_ndarray(np.ascontiguousarray(picture), "rgb24")
                    if first_ns < 0:
                        first_ns = made_ns
                    ms = last_ms = max(last_ms + 1, (made_ns - first_ns) // 1_000_000)
                    video.pts, video.time_base = ms, TIME_BASE
                    for packet in stream.encode(video):
                        container.mux(packet)
                    line = {"frame": self.frames, "chunk": chunk, "seq": seq, "ms": ms}
                    sidecar.write(json.dumps(line) + "\n")
                    self.frames += 1
                if stream is not None:
                    for packet in stream.encode(None):
                        container.mux(packet)
                end = {"end": True, "frames": self.frames, "dropped": self.dropped}
                sidecar.write(json.dumps(end) + "\n")
        finally:
            if container is not None:
                container.close()
            self._done.set()
