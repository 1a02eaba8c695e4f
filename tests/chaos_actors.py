"""Child-process bodies for tests/test_chaos.py (importable, so spawn works).

- :func:`bystander`: a steady client in a process of its own; its sessions are
  never touched by the test, and it reports, when asked, every gap in their
  chunk indices, every notice it got, and every chunk that did not carry its
  session's conditioning (a row read from another session's slot).
- Clients of the newer surfaces doing random things for a while, valid and
  invalid: :func:`inputs_chaos` (loans and large arrays by value),
  :func:`async_chaos` (asyncio, several tasks on one client, cancelled waits),
  :func:`pool_chaos` (a pool over daemons one of which the test kills).
  ``hostile`` names a kind of abuse mixed in (see :data:`HOSTILE`).

Refusals (any :class:`~rte.errors.RteError`) are expected and ignored; anything
else is a defect and ends the process with a traceback and exit code 1, which
the test reports with the round's seed. Chunks of the null model carry their
session's ``tag``: each actor's tags say whose they are (:func:`tag_for`), so
an actor checks that every chunk it is handed is its own session's.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rte.client import (
    Chunk,
    ChunkBatch,
    EngineClient,
    PoolClient,
    ShmClient,
    connect,
    connect_async,
    connect_pool,
)
from rte.client.aio import AsyncClient
from rte.client.inputs import InputLoan
from rte.errors import EngineGone, RteError
from rte.models.null import tag_of

FRAME = (256, 256, 3)  # an input of the reference model's 64x64 output (k = 4): by slot
SMALL = (64, 64, 3)  # the same, k = 1: inline in the record
BAD_FRAMES = [  # refused by the model (by slot, inline), or too big for a slot
    ((300, 300, 3), "uint8"),
    ((64, 64), "uint8"),
    ((256, 256, 3), "float32"),
    ((1024, 1024, 3), "uint8"),
]
TAG_SPAN = 1_000_000  # tag // TAG_SPAN says whose session a chunk is of
HOSTILE = ("loan-shapes", "arguments", "held-views")  # the kinds of abuse an actor mixes in


def tag_for(owner: int, n: int) -> int:
    """The ``n``-th tag of the session numbered ``owner`` (across every actor)."""
    return owner * TAG_SPAN + n


class Unexpected(AssertionError):
    """What an actor saw that no refusal explains."""


def _read(got: Chunk | ChunkBatch) -> float:
    latents = [got.latent] if isinstance(got, Chunk) else got.latents
    return sum(float(np.asarray(latent, np.float64).sum()) for latent in latents)


def check_rows(batch: ChunkBatch, owners: dict[str, int]) -> None:
    """Each row of a null-model batch carries its own session's tag (or none yet)."""
    latents = batch.latents
    for i, session in enumerate(batch.sessions):
        tag = tag_of(np.asarray(latents[i]))
        owner = owners.get(session)
        if owner is not None and tag != -1 and tag // TAG_SPAN != owner:
            raise Unexpected(
                f"chunk {int(batch.chunks[i])} of {session!r} carries tag {tag}: "
                f"session {tag // TAG_SPAN}'s, not {owner}'s"
            )


def run(ready: Any, body: Callable[..., None], *args: Any) -> None:
    """``body(*args)`` once this process has started (imports done): ``ready`` is
    set then, so the test times its faults from the moment the actors act."""
    ready.set()
    body(*args)


# -- the bystander -------------------------------------------------------------


def bystander(name: str, conditioning: dict[str, dict[str, Any]], conn: Any) -> None:
    """Attach ``conditioning``'s sessions to daemon ``name``, then stream, and on
    ``"report"`` send what was seen (``"stop"``: close first, send, and end)."""
    client = ShmClient(name, timeout=30)
    for session, given in conditioning.items():
        client.attach(session, given, timeout=30)
    null = client.manifest.model == "null"
    owners = {s: c["tag"] // TAG_SPAN for s, c in conditioning.items() if "tag" in c}
    last: dict[str, int] = {}
    report: dict[str, Any] = {"chunks": dict.fromkeys(conditioning, 0), "gaps": [], "wrong": []}
    report |= {"notices": [], "errors": []}
    conn.send(client.index)
    while True:
        if conn.poll():
            command = conn.recv()
            if command == "stop":
                client.close()
            conn.send(report)
            if command == "stop":
                return
        try:
            batch = client.poll_batch(timeout=0.02)
            notices = client.notices()
        except RteError as exc:  # its daemon is gone: the test will say so
            report["errors"].append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.05)
            continue
        report["notices"] += [f"{n.kind.name} {n.session}: {n.message}" for n in notices]
        if batch is None:
            continue
        with batch:
            for i, session in enumerate(batch.sessions):
                index = int(batch.chunks[i])
                if session in last and index != last[session] + 1:
                    report["gaps"].append((session, last[session], index))
                last[session] = index
                report["chunks"][session] = report["chunks"].get(session, 0) + 1
            if null:
                try:
                    check_rows(batch, owners)
                except Unexpected as exc:
                    report["wrong"].append(str(exc))


# -- the random actors ------------------------------------------------------------


class Actor:
    """What every actor keeps: its rng, its chunks held, its sessions' owners."""

    def __init__(self, ident: int, seed: int, hostile: str | None) -> None:
        self.ident = ident
        self.rng = random.Random(seed)
        self.hostile = hostile
        self.held: list[Chunk | ChunkBatch] = []  # handed out, not yet released
        self.pinned: list[ChunkBatch] = []  # held until the client closes
        self.owners = {self.session(k): ident * 8 + k for k in range(4)}
        self.tags = 0

    def session(self, k: int | None = None) -> str:
        return f"a{self.ident}-{self.rng.randrange(4) if k is None else k}"

    def tag(self, session: str) -> int:
        self.tags += 1
        return tag_for(self.owners[session], self.tags)

    def take(self, got: Chunk | ChunkBatch | None) -> None:
        """Read what came and keep it; release some of what is held. In
        ``held-views``, everything held is read again each time: after a close,
        its daemon's death or the loss of its pool member, a view must still read
        (or raise a clear error), never crash."""
        if got is not None:
            _read(got)
            self.held.append(got)
        if self.hostile == "held-views":
            for held in self.held + self.pinned:
                with contextlib.suppress(RteError):
                    _read(held)
        keep = 0.8 if self.hostile == "held-views" and len(self.held) < 8 else 0.4
        if self.held and self.rng.random() > keep:
            self.held.pop(self.rng.randrange(len(self.held))).release()

    def hold_across_close(self, client: EngineClient) -> None:
        """``held-views``, at once: a chunk held while its client closes, then read."""
        client.attach(self.session(0), timeout=5)
        chunk = None
        deadline = time.monotonic() + 3
        while chunk is None and time.monotonic() < deadline:
            chunk = client.poll(timeout=0.1)
        client.close()
        if chunk is not None:
            with contextlib.suppress(RteError):
                _read(chunk)

    def pin_every_session(self, client: EngineClient) -> None:
        """``held-views`` in a pool: attach every session (some land on the daemon
        that will die), and hold a batch with a chunk of each for good."""
        missing = set(self.owners)
        for session in sorted(missing):
            client.attach(session, {"tag": self.tag(session)}, timeout=5)
        deadline = time.monotonic() + 5
        while missing and time.monotonic() < deadline:
            batch = client.poll_batch(timeout=0.1)
            if batch is not None and missing & set(batch.sessions):
                missing -= set(batch.sessions)
                self.pinned.append(batch)
            elif batch is not None:
                batch.release()

    def dropped(self) -> None:
        """The client is closed: what it held is read (``held-views``) and released
        (nothing to give back, and no error)."""
        self.take(None)
        held, self.held, self.pinned = self.held + self.pinned, [], []
        for thing in held:
            thing.release()

    def abuse(self, client: EngineClient | AsyncClient) -> tuple[str, Callable[[], Any]]:
        """One call of the ``hostile`` kind, to make (and await, on an AsyncClient),
        then hand to :meth:`judge`: it may raise an RteError or do no harm."""
        rng = self.rng
        session = self.session()
        calls: list[tuple[str, Callable[[], Any]]] = []
        if self.hostile == "loan-shapes":
            shape = rng.choice([(-1, 3), (0, 3), (-4, -4, 3), (1 << 40, 1 << 40), (2**62, 4)])
            dtype = rng.choice(["uint8", "float64"])
            calls.append((f"loan({shape}, {dtype})", lambda: client.loan(shape, dtype)))
        elif self.hostile == "arguments":
            credits = rng.choice([1.5, -1, 256, 2**70])
            bad_session: Any = rng.choice([7, b"x", "x" * 5000])
            conditioning: Any = rng.choice(["move", 3, [("move", 1)]])
            shape: Any = rng.choice(["abc", 3.5, None])
            dtype: Any = rng.choice(["nonsense", object])
            calls += [
                (f"attach(credits={credits})", lambda: client.attach(session, credits=credits)),
                (f"attach({bad_session!r:.20})", lambda: client.attach(bad_session, timeout=1)),
                (f"act({conditioning!r})", lambda: client.act(session, conditioning)),
                (f"loan({shape!r})", lambda: client.loan(shape, "uint8", timeout=0.2)),
                (f"loan(dtype={dtype!r})", lambda: client.loan(FRAME, dtype, timeout=0.2)),
            ]
        else:
            calls.append(("nothing", lambda: None))
        return rng.choice(calls)

    @staticmethod
    def judge(call: str, outcome: Any) -> None:
        """A loan of a shape no slot can hold must have been refused."""
        if isinstance(outcome, InputLoan):
            got = outcome.array.shape
            outcome.abort()
            if call.startswith("loan(") and got != FRAME:
                raise Unexpected(f"{call} gave an array of {got}")


def inputs_chaos(
    name: str, ident: int, seed: int, seconds: float, hostile: str | None = None
) -> None:
    """Random requests with large inputs against daemon ``name`` (reference model):
    frames loaned, filled and sent, or aborted, or kept unsent; frames by value,
    by slot and inline; frames of the wrong shape, too big for a slot, strided."""
    actor = Actor(ident, seed, hostile)
    rng = actor.rng
    deadline = time.monotonic() + seconds
    client: ShmClient | None = None
    kept: list[Any] = []  # loans never sent nor aborted (the daemon reclaims them)
    if hostile == "held-views":
        with contextlib.suppress(RteError):
            actor.hold_across_close(ShmClient(name, timeout=5))
    while time.monotonic() < deadline:
        try:
            if client is None:
                client, kept = ShmClient(name, timeout=5), []
            op = rng.random()
            session = actor.session()
            if op < 0.15:
                client.attach(session, {"frame": np.zeros(FRAME, np.uint8)}, timeout=2)
            elif op < 0.35:  # a loan, filled in place, sent; or given back; or kept
                loan = client.loan(rng.choice([FRAME, FRAME, SMALL]), "uint8", timeout=0.5)
                loan.array[...] = rng.randrange(256)
                fate = rng.random()
                if fate < 0.7:
                    client.act(session, {"frame": loan.array, "move": (1, 0)})
                elif fate < 0.9:
                    loan.abort()
                else:
                    kept.append(loan)
            elif op < 0.5:  # by value: copied into a slot, or inline
                shape = rng.choice([FRAME, SMALL, (512, 512, 3)])
                frame = np.full(shape, rng.randrange(256), np.uint8)
                client.act(session, {"frame": frame[::-1] if rng.random() < 0.3 else frame})
            elif op < 0.6:  # wrong: refused by the model, by slot or inline; too big
                shape, dtype = rng.choice(BAD_FRAMES)
                bad = np.zeros(shape, dtype)
                client.act(session, {"frame": bad})
            elif op < 0.65:
                client.reset(session, None if rng.random() < 0.5 else {"frame": 3}, timeout=2)
            elif op < 0.7:
                client.detach(session, timeout=2)
            elif op < 0.9:
                actor.take(client.poll(timeout=0.02))
                client.notices()
            elif op < 0.95 and hostile is not None:
                call, make = actor.abuse(client)
                actor.judge(call, make())
            else:
                client.close()
                client = None
                actor.dropped()
        except RteError:
            continue
    if client is not None and rng.random() < 0.5:
        client.close()
        actor.dropped()


def async_chaos(
    name: str, ident: int, seed: int, seconds: float, hostile: str | None = None
) -> None:
    """Random asyncio use of daemon ``name``: a reader task and an actor task on one
    client, waits cut short (cancelled), the client closed under waiting tasks."""
    asyncio.run(_async_chaos(name, ident, seed, seconds, hostile))


async def _async_chaos(
    name: str, ident: int, seed: int, seconds: float, hostile: str | None
) -> None:
    actor = Actor(ident, seed, hostile)
    rng = actor.rng
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            client = await connect_async(name, timeout=5)
        except RteError:
            await asyncio.sleep(0.05)
            continue
        until = min(deadline, time.monotonic() + rng.uniform(0.2, 0.8))
        tasks = [
            asyncio.create_task(_reader(client, actor, until)),
            asyncio.create_task(_actor(client, actor, until)),
        ]
        await asyncio.wait(tasks, timeout=rng.uniform(0.1, 1.0))
        if rng.random() < 0.8 or time.monotonic() < deadline:
            await client.close()  # under tasks that may still wait
        await asyncio.gather(*tasks)  # each ends on its own deadline or the close
        actor.dropped()


async def _reader(client: AsyncClient, actor: Actor, until: float) -> None:
    rng = actor.rng
    while time.monotonic() < until:
        try:
            if rng.random() < 0.5:  # a wait cut short: cancelled inside poll
                with contextlib.suppress(TimeoutError):
                    actor.take(await asyncio.wait_for(client.poll(1.0), rng.uniform(0, 0.01)))
            elif rng.random() < 0.5:
                actor.take(await client.poll_batch(0.05))
            else:
                actor.take(await client.poll(0.05))
            client.notices()
        except RteError:
            if client.closed:
                return
            await asyncio.sleep(0.01)


async def _actor(client: AsyncClient, actor: Actor, until: float) -> None:
    rng = actor.rng
    while time.monotonic() < until:
        session = actor.session()
        op = rng.random()
        try:
            if op < 0.25:
                call = client.attach(session, {"move": (0, 1)} if rng.random() < 0.8 else {"x": 1})
                if rng.random() < 0.3:  # cancelled while it waits for its answer
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(call, rng.uniform(0, 0.005))
                else:
                    await call
            elif op < 0.55:
                await client.act(session, {"move": (rng.randrange(-2, 3), 1)})
            elif op < 0.7:
                loan = await client.loan(FRAME, "uint8", timeout=0.3)
                loan.array[...] = 9
                if rng.random() < 0.8:
                    await client.act(session, {"frame": loan.array})
                else:
                    loan.abort()
            elif op < 0.8:
                await client.act(session, {"frame": np.ones(FRAME, np.uint8)})
            elif op < 0.88:
                await client.reset(session, timeout=2)
            elif op < 0.93:
                await client.detach(session, timeout=2)
            elif op < 0.97 and actor.hostile is not None:
                call, make = actor.abuse(client)
                outcome = make()
                actor.judge(call, await outcome if inspect.isawaitable(outcome) else outcome)
            else:
                await asyncio.sleep(0.01)
        except RteError:
            if client.closed:
                return
            await asyncio.sleep(0.005)


def pool_chaos(
    names: list[str], ident: int, seed: int, seconds: float, hostile: str | None = None
) -> None:
    """Random use of a pool over daemons ``names`` (null model), one of which the
    test kills meanwhile: sessions on the other go on; every chunk is checked to be
    its own session's. ``names`` of one item is one daemon (a supervisor's NAME: its
    replicas as a pool), connected again when it dies."""
    actor = Actor(ident, seed, hostile)
    rng = actor.rng
    deadline = time.monotonic() + seconds
    client: EngineClient | None = None
    while time.monotonic() < deadline:
        try:
            if client is None:
                if len(names) == 1:
                    client = connect(names[0], timeout=5)
                else:
                    client = connect_pool(names, timeout=5, reattach=rng.random() < 0.5)
                if hostile == "held-views" and not actor.pinned:
                    actor.pin_every_session(client)
            op = rng.random()
            session = actor.session()
            if op < 0.2:
                good = rng.random() < 0.8
                tag = {"tag": actor.tag(session)} if good else {"tag": "x"}
                client.attach(session, tag, timeout=2)
            elif op < 0.45:
                client.act(session, {"tag": actor.tag(session)})
            elif op < 0.5:
                client.reset(session, {"tag": actor.tag(session)}, timeout=2)
            elif op < 0.58:
                client.detach(session, timeout=2)
            elif op < 0.93:
                batch = client.poll_batch(timeout=0.02)
                if batch is not None:
                    check_rows(batch, actor.owners)
                actor.take(batch)
                client.notices()
            elif hostile != "held-views":  # (which keeps its pins across a daemon's death)
                client.close()
                client = None
                actor.dropped()
        except EngineGone:  # a lost member's session; or, alone, its daemon died
            if client is not None and not isinstance(client, PoolClient):
                actor.take(None)  # (held-views: each chunk held read after the death,
                client.close()  # and again after the close)
                actor.dropped()
                client = None
        except RteError:
            continue
    if isinstance(client, PoolClient) and hostile == "held-views":
        _after_a_loss(client, actor)
    if client is not None and rng.random() < 0.5:
        client.close()
        actor.dropped()


def _after_a_loss(client: PoolClient, actor: Actor) -> None:
    """Wait (bounded) until the pool has lost the daemon the test killed, then
    read every chunk held, those from the lost daemon included."""
    deadline = time.monotonic() + 5
    while len(client.live()) == len(client.members):
        if time.monotonic() > deadline:
            raise Unexpected(f"pool {client.name!r} never noticed its daemon's death")
        with contextlib.suppress(RteError):
            actor.take(client.poll_batch(timeout=0.05))
    actor.take(None)
