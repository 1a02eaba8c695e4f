"""The sync EngineClient interface over an AsyncClient, on an event loop of its own.

So that the behaviour bodies written once for the clients (test_client.py)
run unchanged on the asyncio form: every call is the AsyncClient's coroutine,
run to completion on a real asyncio loop; the client waits on its file
descriptor as it would in a server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator, Mapping
from typing import Any, TypeVar

from rte.client import AsyncClient, Chunk, ChunkBatch, Notice
from rte.client.inputs import InputLoan

T = TypeVar("T")


class LoopClient:
    def __init__(self, connecting: Awaitable[AsyncClient]) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.client = self._run(connecting)
        except BaseException:
            self.loop.close()
            raise
        self.name = self.client.name
        self.manifest = self.client.manifest

    def _run(self, coroutine: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coroutine)

    @property
    def sessions(self) -> set[str]:
        return self.client.sessions

    @property
    def closed(self) -> bool:
        return self.client.closed

    def held(self) -> int:
        return self.client.held()

    def notices(self) -> list[Notice]:
        return self.client.notices()

    def attach(
        self, session: str, conditioning: Mapping[str, Any] | None = None, **kw: Any
    ) -> None:
        self._run(self.client.attach(session, conditioning, **kw))

    def act(self, session: str, conditioning: Mapping[str, Any], **kw: Any) -> None:
        self._run(self.client.act(session, conditioning, **kw))

    def reset(self, session: str, conditioning: Mapping[str, Any] | None = None, **kw: Any) -> None:
        self._run(self.client.reset(session, conditioning, **kw))

    def detach(self, session: str, **kw: Any) -> None:
        self._run(self.client.detach(session, **kw))

    def suspend(self, session: str, **kw: Any) -> None:
        self._run(self.client.suspend(session, **kw))

    def resume(self, session: str, **kw: Any) -> None:
        self._run(self.client.resume(session, **kw))

    def export(self, session: str, **kw: Any) -> Any:
        return self._run(self.client.export(session, **kw))

    def loan(self, shape: tuple[int, ...], dtype: Any, **kw: Any) -> InputLoan:
        return self._run(self.client.loan(shape, dtype, **kw))

    def poll(self, timeout: float = 1.0) -> Chunk | None:
        return self._run(self.client.poll(timeout))

    def poll_batch(self, timeout: float = 1.0) -> ChunkBatch | None:
        return self._run(self.client.poll_batch(timeout))

    def results(self, timeout: float = 1.0) -> Iterator[Chunk]:
        while (chunk := self.poll(timeout)) is not None:
            yield chunk

    def close(self) -> None:
        if not self.loop.is_closed():
            self._run(self.client.close())

    def shut(self) -> None:
        """Close the client, then its loop (the fixture's finalizer)."""
        self.close()
        self.loop.close()

    def __enter__(self) -> LoopClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
