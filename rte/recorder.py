"""Recorders: any client, its sessions' traces written on the way through.

A :class:`Recorder` wraps an :class:`~rte.client.EngineClient` (shm, in
process, pool: public API only) and an :class:`AsyncRecorder` an
:class:`~rte.client.AsyncClient`; each delegates ``attach``, ``act``,
``reset``, ``poll``, ``poll_batch``, ``results``, ``notices``, ``detach`` and
``close`` and writes what passes into a trace (:mod:`rte.trace`): the attach,
each action with the chunk it applied at, and every chunk's hash. A chunk is
hashed when it is handed out, before the caller can release it.

``out`` a file (a path or an open text file): one session is recorded,
``session``, or the first attached. ``out`` a function of a session's name to
its file (or None: not recorded): every session attached is recorded into the
file it names, each its own trace (a gateway's tabs, say). A trace is one
attach's life: it ends at the session's detach, at :meth:`end`, or when the
recorder closes; a reset ends it too, and with a function the session's next
life is recorded into the file it names next (a single file refuses the reset).

What is written, and when, is :class:`~rte.recording.Recording`'s (an action's
line just before the chunk it applied at, a refusal the caller drains through
the recorder as refused; a trace that cannot be written stops, never the
stream). Everything else passes through untouched:

    with connect("mydaemon") as client, Recorder(client, Path("walk.jsonl")) as rec:
        rec.attach("alice", {"prompt": "a forest"})
        for chunk in rec.results(timeout=1.0): ...
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from rte.client import AsyncClient, Chunk, ChunkBatch, EngineClient
from rte.contract import Manifest, Notice, NoticeKind
from rte.errors import RequestError, RteError
from rte.overload import DEFAULT_PRIORITY
from rte.recording import Recording, log
from rte.trace import TraceWriter, decode_value, encode_value, header_of

__all__ = ["AsyncRecorder", "Recorder", "Recording", "TraceOut"]

TraceOut = Path | IO[str] | Callable[[str], Path | IO[str] | None]
"""Where a recorder writes: one session's file, or each session's (None: not recorded)."""


class _Recorded:
    """What both recorders share: the recordings, and how what passes is seen."""

    def __init__(
        self,
        manifest: Manifest,
        engine: str,
        out: TraceOut,
        session: str | None,
        identity: Mapping[str, Any] | None,
        device: str | None,
        heavy_keys: list[str] | None,
    ) -> None:
        self._header = header_of(
            manifest, engine, identity=identity, device=device, heavy_keys=heavy_keys
        )
        self._each = out if callable(out) else None  # a file for each session
        self._one = None if callable(out) else Recording(TraceWriter(out), self._header)
        self.recordings: dict[str, Recording] = {}  # the sessions being recorded
        self._wanted = session
        self._kept: list[Notice] = []  # notices read early (see _landing), the caller's still

    @property
    def recording(self) -> Recording | None:
        """The one file's recording (None when each session has its own)."""
        return self._one

    def _client_notices(self) -> list[Notice]:
        raise NotImplementedError

    def _read_notices(self) -> None:
        """Read the notices now (kept for the caller), so refusals are seen."""
        with contextlib.suppress(RteError):  # a dead or closed client: nothing more comes
            self._kept += self._saw_notices(self._client_notices())

    def _landing(self, recording: Recording, applied: int) -> None:
        """Before a chunk lands the acts up to ``applied``: read the notices, so that
        an act refused meanwhile is written as refused, not as applied there."""
        if recording.passes_over(applied):
            self._read_notices()

    def _recorded(self, session: str) -> bool:
        return session in self.recordings

    def _check_attach(self, session: str, conditioning: Mapping[str, Any] | None) -> bool:
        """Whether this attach may be a recorded one (its conditioning checked first)."""
        if session in self.recordings or self._wanted not in (None, session):
            return False
        if self._one is not None and (self._one.session is not None or self._one.done):
            return False
        encode_value(dict(conditioning or {}))  # a value a trace cannot hold: before it is sent
        return True

    def _begin(
        self,
        session: str,
        conditioning: Mapping[str, Any],
        credits: int,
        priority: int,
        from_zero: bool = False,
    ) -> None:
        """Record ``session`` (attached) from here: into the one file, or its own."""
        if self._each is None:
            recording = self._one
            assert recording is not None
        else:
            try:
                out = self._each(session)
                if out is None:
                    return
                writer = TraceWriter(out)
            except OSError as exc:  # the session is attached all the same
                log.warning("no trace of %r: %s", session, exc)
                return
            recording = Recording(writer, self._header, from_zero)
        self.recordings[session] = recording
        recording.attached(session, conditioning, credits, priority)

    def end(self, session: str) -> Recording | None:
        """End ``session``'s trace now (the session goes on, unrecorded); its
        recording, or None if it was not being recorded."""
        if session not in self.recordings:
            return None
        self._read_notices()
        recording = self.recordings.pop(session)
        recording.end()
        return recording

    def _act_encoded(self, session: str, conditioning: Mapping[str, Any]) -> Any:
        return encode_value(dict(conditioning)) if self._recorded(session) else None

    def _acted(self, session: str, seq: int, encoded: Any) -> None:
        recording = self.recordings.get(session)
        if recording is not None:
            recording.acted(seq, encoded)

    def _resetting(self, session: str, conditioning: Mapping[str, Any] | None) -> bool:
        """Before a reset of ``session``: end its trace and begin the next (refused with
        one file); whether it was recorded."""
        recording = self.recordings.get(session)
        if recording is None:
            return False
        if self._each is None:
            raise RequestError(f"session {session!r} is being recorded: a trace holds no reset")
        if conditioning is not None:
            encode_value(dict(conditioning))
        self.end(session)
        keep = decode_value(recording.conditioning) if conditioning is None else conditioning
        self._begin(session, keep, recording.credits, recording.priority, from_zero=True)
        return True

    def _saw_chunk(self, chunk: Chunk | None) -> Chunk | None:
        if chunk is not None and (recording := self.recordings.get(chunk.session)) is not None:
            self._landing(recording, chunk.applied)
            recording.chunk(chunk.chunk, chunk.latent, chunk.applied)
        return chunk

    def _saw_batch(self, batch: ChunkBatch | None) -> ChunkBatch | None:
        if batch is not None and self.recordings:
            for i, session in enumerate(batch.sessions):
                if (recording := self.recordings.get(session)) is not None:
                    applied = batch.applied_of(i)
                    self._landing(recording, applied)
                    recording.chunk(batch.chunk_index(i), np.asarray(batch.latents[i]), applied)
        return batch

    def _saw_notices(self, notices: list[Notice]) -> list[Notice]:
        for notice in notices:
            recording = self.recordings.get(notice.session)
            if notice.kind is NoticeKind.ERROR and recording is not None and notice.seq:
                recording.refused(notice.seq, notice.message)
        return notices

    def _end_all(self) -> None:
        for session in list(self.recordings):
            self.end(session)
        if self._one is not None:
            self._one.end()


class Recorder(_Recorded):
    """An :class:`EngineClient` whose sessions are recorded into ``out`` (a file:
    ``session``, or the first attached; a function: each session's file);
    ``identity``, ``device`` and ``heavy_keys`` go into the header when the caller
    knows them (a client does not say). ``close()`` or the end of a ``with`` block
    ends every trace; the client stays the caller's."""

    def __init__(
        self,
        client: EngineClient,
        out: TraceOut,
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
            self._begin(session, conditioning or {}, credits, priority)

    def act(self, session: str, conditioning: Mapping[str, Any], *, timeout: float = 1.0) -> int:
        """:meth:`EngineClient.act`; the action recorded (copied before it is sent)."""
        encoded = self._act_encoded(session, conditioning)
        seq = self.client.act(session, conditioning, timeout=timeout)
        self._acted(session, seq, encoded)
        return seq

    def reset(
        self, session: str, conditioning: Mapping[str, Any] | None = None, *, timeout: float = 5.0
    ) -> None:
        """:meth:`EngineClient.reset`: a recorded session's trace ends and its next
        life's begins (with one file: refused, RequestError)."""
        recorded = self._resetting(session, conditioning)
        try:
            self.client.reset(session, conditioning, timeout=timeout)
        except BaseException:
            if recorded:
                self.end(session)  # refused: it goes on as it was, unrecorded
            raise

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
        """:meth:`EngineClient.detach`; the session's trace ends."""
        try:
            self.client.detach(session, timeout=timeout)
        finally:
            self.end(session)

    @property
    def manifest(self) -> Manifest:
        return self.client.manifest

    def close(self) -> None:
        """End every trace (the refusals still waiting read first). Idempotent."""
        self._end_all()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRecorder(_Recorded):
    """:class:`Recorder` for an :class:`AsyncClient` (its waiting calls awaited)."""

    def __init__(
        self,
        client: AsyncClient,
        out: TraceOut,
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
        if record:  # (no chunk of it was handed out meanwhile: it had none)
            self._begin(session, conditioning or {}, credits, priority)

    async def act(
        self, session: str, conditioning: Mapping[str, Any], *, timeout: float = 1.0
    ) -> int:
        # the send and its seq's return do not yield: no chunk can land it before
        # it is recorded as sent
        encoded = self._act_encoded(session, conditioning)
        seq = await self.client.act(session, conditioning, timeout=timeout)
        self._acted(session, seq, encoded)
        return seq

    async def reset(
        self, session: str, conditioning: Mapping[str, Any] | None = None, *, timeout: float = 5.0
    ) -> None:
        recorded = self._resetting(session, conditioning)
        try:
            await self.client.reset(session, conditioning, timeout=timeout)
        except BaseException:
            if recorded:
                self.end(session)
            raise

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
        try:
            await self.client.detach(session, timeout=timeout)
        finally:
            self.end(session)

    def close(self) -> None:
        """End every trace (the client stays the caller's). Idempotent."""
        self._end_all()

    async def __aenter__(self) -> AsyncRecorder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
