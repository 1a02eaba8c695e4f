"""Recorders: any client, its session's trace written on the way through.

A :class:`Recorder` wraps an :class:`~rte.client.EngineClient` (shm, in
process, pool: public API only) and an :class:`AsyncRecorder` an
:class:`~rte.client.AsyncClient`; each delegates ``attach``, ``act``,
``poll``, ``poll_batch``, ``results``, ``notices``, ``detach`` and ``close``
and writes what passes into a trace (:mod:`rte.trace`): the attach, each
action with the chunk it applied at, and every chunk's hash. A chunk is hashed
when it is handed out, before the caller can release it.

One session is recorded: ``session``, or the first attached. An action's chunk
is known once a chunk's receipt (``applied``) reaches its seq, so its line is
written just before that chunk's; an action the engine refused (a notice the
caller drains through the recorder) is written as refused; the rest when the
recorder closes. Everything else passes through untouched:

    with connect("mydaemon") as client, Recorder(client, Path("walk.jsonl")) as rec:
        rec.attach("alice", {"prompt": "a forest"})
        for chunk in rec.results(timeout=1.0): ...
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from rte.client import AsyncClient, Chunk, ChunkBatch, EngineClient
from rte.contract import Manifest, Notice, NoticeKind
from rte.errors import RequestError
from rte.overload import DEFAULT_PRIORITY
from rte.trace import TraceWriter, chunk_hash, encode_value, header_of

__all__ = ["AsyncRecorder", "Recorder", "Recording"]


# -- recording ---------------------------------------------------------------------


class Recording:
    """The trace of one session as it happens: what a :class:`Recorder` calls on the
    way through. Acts wait until a chunk's receipt shows where they applied."""

    def __init__(self, writer: TraceWriter, header: dict[str, Any]) -> None:
        self.writer, self.header = writer, header
        self.session: str | None = None
        self._t0 = 0.0
        self._waiting: list[tuple[int, dict[str, Any], float]] = []  # (seq, encoded, t)
        self.chunks = 0
        self.done = False

    def now(self) -> float:
        return round(time.monotonic() - self._t0, 6)

    def attached(
        self, session: str, conditioning: Mapping[str, Any], credits: int, priority: int
    ) -> None:
        self.session, self._t0 = session, time.monotonic()
        self.writer.write(self.header)
        encoded = encode_value(dict(conditioning))
        self.writer.write(
            {
                "kind": "attach",
                "session": session,
                "conditioning": encoded,
                "credits": credits,
                "priority": priority,
                "seeds": {"session": session},
            }
        )

    def acted(self, seq: int, encoded: Any) -> None:
        """Action ``seq`` was sent, its conditioning ``encoded`` (:func:`encode_value`)."""
        self._waiting.append((seq, encoded, self.now()))

    def refused(self, seq: int, message: str) -> None:
        for i, (s, encoded, t) in enumerate(self._waiting):
            if s == seq:
                del self._waiting[i]
                self._act(s, encoded, t, None, message)
                return

    def passes_over(self, applied: int) -> bool:
        """Whether a chunk of receipt ``applied`` would land an act other than
        ``applied`` itself: one merged into it, or one refused (its notice unread)."""
        return any(seq < applied for seq, _, _ in self._waiting)

    def chunk(self, index: int, latent: np.ndarray[Any, Any], applied: int) -> None:
        landed = [w for w in self._waiting if w[0] <= applied]
        if landed:
            self._waiting = [w for w in self._waiting if w[0] > applied]
            for seq, encoded, t in landed:
                self._act(seq, encoded, t, index)
        digest = chunk_hash(latent)
        record = {"kind": "chunk", "index": index, "blake2b": digest, "applied": applied}
        self.writer.write({**record, "t": self.now()})
        self.chunks += 1

    def _act(
        self, seq: int, encoded: Any, t: float, chunk: int | None, refused: str | None = None
    ) -> None:
        record: dict[str, Any] = {
            "kind": "act",
            "seq": seq,
            "chunk": chunk,
            "conditioning": encoded,
        }
        record["t"] = t
        if refused is not None:
            record["refused"] = refused
        self.writer.write(record)

    def end(self) -> None:
        if self.done:
            return
        self.done = True
        if self.session is not None:
            for seq, encoded, t in self._waiting:  # applied at no chunk it took
                self._act(seq, encoded, t, None)
            self.writer.write({"kind": "end", "chunks": self.chunks, "seconds": self.now()})
        self.writer.close()


class _Recorded:
    """What both recorders share: the recording, and how what passes is seen."""

    def __init__(
        self,
        manifest: Manifest,
        engine: str,
        out: Path | IO[str],
        session: str | None,
        identity: Mapping[str, Any] | None,
        device: str | None,
        heavy_keys: list[str] | None,
    ) -> None:
        header = header_of(
            manifest, engine, identity=identity, device=device, heavy_keys=heavy_keys
        )
        self.recording = Recording(TraceWriter(out), header)
        self._wanted = session
        self._kept: list[Notice] = []  # notices read early (see _landing), the caller's still

    def _client_notices(self) -> list[Notice]:
        raise NotImplementedError

    def _landing(self, applied: int) -> None:
        """Before a chunk lands the acts up to ``applied``: read the notices, so that
        an act refused meanwhile is written as refused, not as applied there."""
        if self.recording.passes_over(applied):
            self._kept += self._saw_notices(self._client_notices())

    def _recorded(self, session: str) -> bool:
        return session == self.recording.session

    def _check_attach(self, session: str, conditioning: Mapping[str, Any] | None) -> bool:
        """Whether this attach is the recorded one (its conditioning checked first)."""
        if self.recording.session is not None or self._wanted not in (None, session):
            return False
        encode_value(dict(conditioning or {}))  # a value a trace cannot hold: before it is sent
        return True

    def _saw_chunk(self, chunk: Chunk | None) -> Chunk | None:
        if chunk is not None and self._recorded(chunk.session):
            self._landing(chunk.applied)
            self.recording.chunk(chunk.chunk, chunk.latent, chunk.applied)
        return chunk

    def _saw_batch(self, batch: ChunkBatch | None) -> ChunkBatch | None:
        if batch is not None:
            for i, session in enumerate(batch.sessions):
                if self._recorded(session):
                    self._landing(batch.applied_of(i))
                    latent = batch.latents[i]
                    self.recording.chunk(
                        batch.chunk_index(i), np.asarray(latent), batch.applied_of(i)
                    )
        return batch

    def _saw_notices(self, notices: list[Notice]) -> list[Notice]:
        for notice in notices:
            if notice.kind is NoticeKind.ERROR and self._recorded(notice.session) and notice.seq:
                self.recording.refused(notice.seq, notice.message)
        return notices


class Recorder(_Recorded):
    """An :class:`EngineClient` whose session (``session``, or the first attached) is
    recorded into ``out``; ``identity``, ``device`` and ``heavy_keys`` go into the
    header when the caller knows them (a client does not say). ``close()`` or the
    end of a ``with`` block ends the trace; the client stays the caller's."""

    def __init__(
        self,
        client: EngineClient,
        out: Path | IO[str],
        *,
        session: str | None = None,
        identity: Mapping[str, Any] | None = None,
        device: str | None = None,
        heavy_keys: list[str] | None = None,
    ) -> None:
        super().__init__(client.manifest, client.name, out, session, identity, device, heavy_keys)
        self.client = client

    def attach(
        self,
        session: str,
        conditioning: Mapping[str, Any] | None = None,
        *,
        credits: int = 0,
        timeout: float = 5.0,
        priority: int = DEFAULT_PRIORITY,
        wait: float = 0.0,
    ) -> None:
        """:meth:`EngineClient.attach`, recorded once it succeeds."""
        record = self._check_attach(session, conditioning)
        self.client.attach(
            session, conditioning, credits=credits, timeout=timeout, priority=priority, wait=wait
        )
        if record:
            self.recording.attached(session, conditioning or {}, credits, priority)

    def act(self, session: str, conditioning: Mapping[str, Any], *, timeout: float = 1.0) -> int:
        """:meth:`EngineClient.act`; the action recorded (copied before it is sent)."""
        recorded = self._recorded(session)
        encoded = encode_value(dict(conditioning)) if recorded else None
        seq = self.client.act(session, conditioning, timeout=timeout)
        if recorded:
            self.recording.acted(seq, encoded)
        return seq

    def reset(self, session: str, *args: Any, **kwargs: Any) -> None:
        """Refused for the recorded session (a trace is one attach's life), else passed on."""
        if self._recorded(session):
            raise RequestError(f"session {session!r} is being recorded: a trace holds no reset")
        self.client.reset(session, *args, **kwargs)

    def poll(self, timeout: float = 1.0) -> Chunk | None:
        return self._saw_chunk(self.client.poll(timeout))

    def poll_batch(self, timeout: float = 1.0) -> ChunkBatch | None:
        return self._saw_batch(self.client.poll_batch(timeout))

    def results(self, timeout: float = 1.0) -> Iterator[Chunk]:
        while (chunk := self.poll(timeout)) is not None:
            yield chunk

    def notices(self) -> list[Notice]:
        kept, self._kept = self._kept, []
        return kept + self._saw_notices(self.client.notices())

    def _client_notices(self) -> list[Notice]:
        return self.client.notices()

    def detach(self, session: str, *, timeout: float = 5.0) -> None:
        self.client.detach(session, timeout=timeout)

    @property
    def manifest(self) -> Manifest:
        return self.client.manifest

    def close(self) -> None:
        """End the trace (the refusals still waiting read first). Idempotent."""
        if not self.recording.done and not self.client.closed:
            self.notices()
        self.recording.end()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRecorder(_Recorded):
    """:class:`Recorder` for an :class:`AsyncClient` (its waiting calls awaited)."""

    def __init__(
        self,
        client: AsyncClient,
        out: Path | IO[str],
        *,
        session: str | None = None,
        identity: Mapping[str, Any] | None = None,
        device: str | None = None,
        heavy_keys: list[str] | None = None,
    ) -> None:
        super().__init__(client.manifest, client.name, out, session, identity, device, heavy_keys)
        self.client = client

    async def attach(
        self,
        session: str,
        conditioning: Mapping[str, Any] | None = None,
        *,
        credits: int = 0,
        timeout: float = 5.0,
        priority: int = DEFAULT_PRIORITY,
    ) -> None:
        record = self._check_attach(session, conditioning)
        await self.client.attach(
            session, conditioning, credits=credits, timeout=timeout, priority=priority
        )
        if record:
            self.recording.attached(session, conditioning or {}, credits, priority)

    async def act(
        self, session: str, conditioning: Mapping[str, Any], *, timeout: float = 1.0
    ) -> int:
        recorded = self._recorded(session)
        encoded = encode_value(dict(conditioning)) if recorded else None
        seq = await self.client.act(session, conditioning, timeout=timeout)
        if recorded:
            self.recording.acted(seq, encoded)
        return seq

    async def poll(self, timeout: float = 1.0) -> Chunk | None:
        return self._saw_chunk(await self.client.poll(timeout))

    async def poll_batch(self, timeout: float = 1.0) -> ChunkBatch | None:
        return self._saw_batch(await self.client.poll_batch(timeout))

    async def results(self, timeout: float = 1.0) -> AsyncIterator[Chunk]:
        while (chunk := await self.poll(timeout)) is not None:
            yield chunk

    def notices(self) -> list[Notice]:
        kept, self._kept = self._kept, []
        return kept + self._saw_notices(self.client.notices())

    def _client_notices(self) -> list[Notice]:
        return self.client.notices()

    async def detach(self, session: str, *, timeout: float = 5.0) -> None:
        await self.client.detach(session, timeout=timeout)

    def close(self) -> None:
        """End the trace (the client stays the caller's). Idempotent."""
        if not self.recording.done and not self.client.closed:
            self.notices()
        self.recording.end()

    async def __aenter__(self) -> AsyncRecorder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
