"""AsyncClient: the EngineClient interface on an asyncio event loop.

    import asyncio
    from rte.client import connect_async

    async def main():
        async with connect_async("mydaemon") as client:
            await client.attach("alice", {"prompt": "a forest"})
            async for chunk in client.results(timeout=1.0):
                with chunk:                      # releases the slab slot on exit
                    frame = chunk.latent         # read-only view into the slab
                await client.act("alice", {"move": (0, 1)})

    asyncio.run(main())

It is the same :class:`~rte.client.core.ClientCore` as the sync client (request
numbering, answers, sorting what arrives, the held count) over the same
transports (:mod:`rte.client.transport`: one daemon's shared memory woken by
its FIFO, an engine on a thread of this process, a pool of daemons); only the
waiting is the loop's (:class:`~rte.client.loop_wait.LoopWait`: a client
sleeps on its transport's file descriptors with ``loop.add_reader``, so one
loop serves many connections with no thread and no polling between wake-ups).

Over a pool (``connect_async("gpu")`` when ``gpu-0``, ``gpu-1``... run) it has
:meth:`AsyncClient.migrate` and :meth:`AsyncClient.drain`, and moves a session
whose daemon drains (``rte drain``) at its next ``poll``, ``poll_batch`` or
``results``, as the sync pool does (:mod:`rte.client.migration`: the same
checks, the same held-back DRAINING notice saying where it went).

Several tasks may use one client at once (one reading results, others
attaching and acting): one of them waits on the descriptors and sorts what
came, the others wait for its news. Connecting and closing wait on a worker
thread (``asyncio.to_thread``), as they may take a while and happen once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Generator, Mapping, Sequence
from typing import Any, TypeVar

from rte.client import arguments
from rte.client.batch import ChunkBatch
from rte.client.core import AdmissionRetry, Call, Chunk, ClientCore
from rte.client.in_flight import Landed, MovesInFlight
from rte.client.inputs import InputLoan
from rte.client.loop_wait import LoopWait
from rte.client.migration import DRAIN_MOVE_S, Move, advance_drained, drain_moves, outcome
from rte.client.pool import PoolTransport
from rte.client.transport import LateExports, Transport
from rte.contract import Manifest, Notice
from rte.errors import AdmissionError, ClientClosedError, RequestError, RequestTimeout
from rte.overload import DEFAULT_PRIORITY
from rte.protocol.requests import Export, Request
from rte.state import SessionState

T = TypeVar("T")
_RETRY_PAUSE_S = (0.0005, 0.02)  # no room: retry after this, doubling up to that


class AsyncClient:
    """A caller's connection to one engine, for coroutines of one event loop.

    Build it with :func:`rte.client.connect_async`; the methods are those of
    :class:`~rte.client.base.EngineClient`, awaited where they wait.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._core = core = ClientCore(transport.name, transport.manifest, transport.give_back)
        transport.number_with(core.next_seq)
        self.name: str = transport.name
        self.manifest: Manifest = transport.manifest
        self._closing = False
        self._wait = LoopWait(transport, core, self._pump, self._check_open)
        self._pool = transport if isinstance(transport, PoolTransport) else None
        self.stranded: dict[str, SessionState] = {}  # as EngineClient's
        self._late = LateExports(core, transport, self.stranded)  # exports given up on
        pool = self._pool
        self._drained = None if pool is None else MovesInFlight(core, pool, 0.0)  # on their way
        if pool is not None:
            pool.late_attaches.stranded = self.stranded  # (a late attach adopted: not stranded)

    @property
    def sessions(self) -> set[str]:
        """The sessions this client has attached and not yet seen leave."""
        return self._core.sessions

    @property
    def closed(self) -> bool:
        return self._closing

    def held(self) -> int:
        """Chunks handed out and not yet released."""
        return self._core.held()

    def notices(self) -> list[Notice]:
        """Drain the notices that were not answers to a call (does not wait)."""
        self._check_open()
        self._pump()
        return self._core.drain_notices()

    # -- sessions -------------------------------------------------------------

    async def attach(
        self,
        session: str,
        conditioning: Mapping[str, Any] | None = None,
        *,
        credits: int = 0,
        timeout: float = 5.0,
        priority: int = DEFAULT_PRIORITY,
        wait: float = 0.0,
        state: SessionState | None = None,
    ) -> None:
        """As :meth:`EngineClient.attach`; ``wait`` retries yield to the loop."""
        timeout, wait = arguments.timeout(timeout), arguments.timeout(wait, "wait")
        retry = AdmissionRetry(wait)
        while True:
            self._check_open()
            request = self._core.attach(session, conditioning, credits, priority, state)
            try:
                await self._call(request, timeout)
                return
            except AdmissionError as refusal:
                await asyncio.sleep(retry.pause(refusal))

    async def suspend(self, session: str, *, timeout: float = 5.0) -> None:
        """As :meth:`EngineClient.suspend`."""
        request = self._core.suspend(session)
        timeout = arguments.timeout(timeout)
        self._check_open()
        await self._call(request, timeout)

    async def resume(self, session: str, *, timeout: float = 5.0) -> None:
        """As :meth:`EngineClient.resume`."""
        request = self._core.resume(session)
        timeout = arguments.timeout(timeout)
        self._check_open()
        await self._call(request, timeout)

    async def export(self, session: str, *, timeout: float = 5.0) -> SessionState:
        """As :meth:`EngineClient.export`."""
        timeout = arguments.timeout(timeout)
        self._check_open()
        transport = self.transport
        if session in self._late:  # (before its slot: the session may be on its way back)
            await self._after_late(session, time.monotonic() + timeout, timeout)
        request = transport.export_into(self._core.export(session), timeout)
        try:
            answer = await self._call(request, timeout)
            return transport.exported(request, int(answer.message or 0))
        finally:
            if not self._late.keeps(request):
                transport.export_done(request)

    async def act(
        self, session: str, conditioning: Mapping[str, Any], *, timeout: float = 1.0
    ) -> int:
        """As :meth:`EngineClient.act` (returns its seq): waits only for room in the
        request ring."""
        request = self._core.act(session, conditioning)
        deadline = time.monotonic() + arguments.timeout(timeout)
        self._check_open()
        if self._drained is not None and self._drained.hold(request):
            return request.seq  # (on its way: sent where it lands)
        if self._late.by_session and self._late.hold(request):
            return request.seq  # (its session's export given up on: sent once it ended)
        await self._send_lent(await self._lend(request, deadline), deadline)
        return request.seq

    async def loan(self, shape: tuple[int, ...], dtype: Any, *, timeout: float = 1.0) -> InputLoan:
        """As :meth:`EngineClient.loan`, waiting (yielding) for input quota."""
        self._core.check_open()
        transport = self.transport
        return await self._retry(lambda: transport.loan(shape, dtype, 0.0), timeout)

    async def reset(
        self, session: str, conditioning: Mapping[str, Any] | None = None, *, timeout: float = 5.0
    ) -> None:
        """As :meth:`EngineClient.reset`."""
        request = self._core.reset(session, conditioning)
        timeout = arguments.timeout(timeout)
        self._check_open()
        await self._call(request, timeout)

    async def detach(self, session: str, *, timeout: float = 5.0) -> None:
        """As :meth:`EngineClient.detach`."""
        request = self._core.detach(session)
        timeout = arguments.timeout(timeout)
        self._check_open()
        await self._call(request, timeout)

    # -- results --------------------------------------------------------------

    async def poll_batch(self, timeout: float = 1.0) -> ChunkBatch | None:
        """The next step's chunks as one batch, or None after ``timeout`` s."""
        deadline = time.monotonic() + arguments.timeout(timeout)
        if self._drained is not None:
            await self.move_drained()
        core = self._core
        while await self._wait.until(self._chunks_or_moves, deadline - time.monotonic()):
            if self._drained:
                await self.move_drained()
            if core.has_chunks():
                return core.take_batch()  # (else another task took it first)
        return None

    async def poll(self, timeout: float = 1.0) -> Chunk | None:
        """The next chunk, or None after ``timeout`` s."""
        if timeout.__class__ is not float or not 0.0 <= timeout <= arguments.MAX_TIMEOUT_S:
            timeout = arguments.timeout(timeout)  # (the fast path: a plain float in range)
        self._check_open()
        if self._drained is not None:
            await self.move_drained()
        core = self._core
        if (chunk := core.next_chunk()) is not None:  # one of a step already here
            return chunk
        deadline = time.monotonic() + timeout
        while await self._wait.until(self._chunks_or_moves, deadline - time.monotonic()):
            if self._drained:
                await self.move_drained()
            if core.has_chunks():
                return core.take_chunk()
        return None

    async def results(self, timeout: float = 1.0) -> AsyncIterator[Chunk]:
        """Chunks as they come; stops after ``timeout`` s without one."""
        while (chunk := await self.poll(timeout)) is not None:
            yield chunk

    # -- moves between a pool's daemons ---------------------------------------

    async def migrate(self, session: str, to: str | Sequence[str], *, timeout: float = 5.0) -> str:
        """As :meth:`PoolClient.migrate`; RequestError unless over a pool."""
        move = Move.of(self._over_pool(), self.sessions, session, to)
        return outcome(await self._fly([move], timeout))[session]

    async def drain(self, name: str, *, timeout: float = 5.0) -> dict[str, str]:
        """As :meth:`PoolClient.drain` (every move at once); RequestError unless
        over a pool."""
        pool = self._over_pool()
        return outcome(await self._fly(drain_moves(pool, self.sessions, name), timeout))

    async def move_drained(self, *, timeout: float = DRAIN_MOVE_S) -> dict[str, str]:
        """As :meth:`PoolClient.move_drained` (``poll`` and ``poll_batch`` call it,
        and take the answers of the moves on their way while they wait; it never
        awaits, so no task enters it while another is in it)."""
        pool, flights = self._pool, self._drained
        if pool is None or flights is None or not (pool.moves or flights):
            return {}
        return advance_drained(self._core, pool, flights, self.stranded, timeout, 0.0)

    def _chunks_or_moves(self) -> bool:
        return self._core.has_chunks() or (self._drained is not None and self._drained.ready())

    async def _fly(self, moves: list[Move], timeout: float) -> list[Landed]:
        """Make ``moves`` at once, waiting (yielding) until each ended."""
        timeout = arguments.timeout(timeout)
        self._check_open()
        deadline = time.monotonic() + timeout
        for move in moves:
            await self._after_late(move.session, deadline, timeout)
        flights = MovesInFlight(self._core, self._over_pool(), 0.0)
        for move in moves:
            flights.start(move, timeout)
        landed = flights.advance()
        while flights:
            await self._wait.until(flights.ready, flights.wait_s())
            landed += flights.advance()
        return landed

    def _over_pool(self) -> PoolTransport:
        if self._pool is None:
            raise RequestError(f"{self.name!r} is one daemon, not a pool: nowhere to move to")
        return self._pool

    # -- lifecycle ------------------------------------------------------------

    async def close(self) -> None:
        """Detach every session, release every chunk, leave the engine (idempotent).
        Other tasks waiting on this client get ClientClosedError."""
        if self._closing:
            return
        self._closing = True
        await self._wait.close()  # the sleeping task leaves the descriptors first
        if self._core.close():
            await asyncio.to_thread(self.transport.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closing:
            raise ClientClosedError(f"this client of {self.name!r} is closed; connect again")

    def _pump(self) -> None:
        """Give back what chunks released, then sort what arrived (at once)."""
        core = self._core
        core.flush()
        core.sort(self.transport.receive(core.release_rows))
        if self._late.by_session:
            self._late.settle()

    async def _call(self, request: Call, timeout: float) -> Notice:
        """As :meth:`EngineClient._call`: a call on a session whose export was given
        up on waits for that export's end first; an export never answered stays late."""
        core = self._core
        deadline = time.monotonic() + timeout
        if request.session in self._late:
            await self._after_late(request.session, deadline, timeout)
        seq = core.expect(request)
        try:
            await self._send_lent(await self._lend(request, deadline), deadline)
            left = deadline - time.monotonic()
            answered = await self._wait.until(lambda: core.answered(seq), left)
        finally:
            core.forget(seq)
        if not answered:
            if isinstance(request, Export):
                home = self.transport.home_of(request.session)
                raise self._late.give_up(request, home, timeout).error
            raise core.unanswered(request, timeout)
        return core.answer(seq)

    async def _after_late(self, session: str, deadline: float, timeout: float) -> None:
        """As :meth:`EngineClient._after_late`."""
        late = self._late
        if session in late and not await self._wait.until(
            lambda: session not in late, deadline - time.monotonic()
        ):
            raise RequestTimeout(
                f"{self.name!r}: an export of {session!r} given up on earlier has not "
                f"ended in {timeout}s (the engine has not come round); nothing was sent"
            )

    async def _lend(self, request: Request, deadline: float) -> Request:
        """The request with its large arrays lent by slot, waiting (yielding) for quota."""
        transport = self.transport
        return await self._retry(lambda: transport.lend(request, 0.0), deadline - time.monotonic())

    async def _send_lent(self, request: Request, deadline: float) -> None:
        """Hand the request over, retrying (yielding) while the ring is full; a
        request that could not be sent gives back the slots it was lent."""
        transport = self.transport
        try:
            await self._retry(lambda: transport.send(request), deadline - time.monotonic())
        except BaseException:
            if not self._core.closed:  # (closed: its slab is unmapped, the daemon reclaims)
                transport.unlend(request)
            raise

    async def _retry(self, attempt: Callable[[], T], timeout: float) -> T:
        """``attempt()`` until it does not raise RequestTimeout (there is room),
        yielding between tries, for up to ``timeout`` s; then its RequestTimeout."""
        deadline = time.monotonic() + timeout
        pause, most = _RETRY_PAUSE_S
        while True:
            self._check_open()
            try:
                return attempt()
            except RequestTimeout:
                if time.monotonic() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(2 * pause, most)


class Connecting:
    """What :func:`rte.client.connect_async` returns: await it for the client, or
    use it in ``async with`` (which closes the client on the way out)."""

    def __init__(self, make: Callable[[], Transport]) -> None:
        self._make = make
        self._client: AsyncClient | None = None

    async def _connect(self) -> AsyncClient:
        return AsyncClient(await asyncio.to_thread(self._make))

    def __await__(self) -> Generator[Any, None, AsyncClient]:
        return self._connect().__await__()

    async def __aenter__(self) -> AsyncClient:
        self._client = await self._connect()
        return self._client

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()
