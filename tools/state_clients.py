"""The state benchmark's clients (:mod:`tools.bench_state`): what they saw, and two that drain.

:class:`Streams` keeps every chunk a client takes by session and chunk index,
with the daemon's emission stamp (``timing.emitted_ns``: ``time.monotonic_ns``,
one clock for every process of the box), so a stall is measured where the
chunks were made, not where a client that was busy in a call got round to
polling them.

:class:`DrainClients` is the drain's two (or more) client processes (spawned:
a client is a process of its own, as a user's is). Each connects a pool of
the full daemon and a spare that is not up yet (a pool goes on without a
member that is down and takes it in at its next attach), attaches its share
of the sessions (so all land on the full one), and streams them; once the
spare is up each takes it in (one attach and detach of a probe session),
and at the parent's word all drain the full daemon at once
(``PoolClient.drain``), or, following ``rte drain`` (:attr:`Share.follows`),
only stream until the pool has moved each of their sessions when the daemon
said so; then they report when they began and ended, each session's stall,
and the chunk gaps and repeats they saw.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from typing import Any

import numpy as np

from rte.client import EngineClient, connect_pool
from rte.errors import RteError

TIMEOUT_S = 10.0  # the most any one wait for a chunk lasts
STEP_S = 60.0  # the most each step of the drain's clients (start, attach, drain) takes


class Streams:
    """Every chunk a client takes, by session: chunk index -> when it was emitted.

    Args:
        client: the client to poll.
        period_ns: the pace's period, the unit of a stall.
    """

    def __init__(self, client: EngineClient, period_ns: float) -> None:
        self.client, self.period_ns = client, period_ns
        self.emitted: dict[str, dict[int, int]] = defaultdict(dict)
        self.repeats = 0

    def take(self, timeout: float) -> None:
        """One chunk, if one comes in ``timeout`` s."""
        chunk = self.client.poll(timeout=timeout)
        if chunk is None:
            return
        with chunk:
            seen = self.emitted[chunk.session]
            self.repeats += chunk.chunk in seen
            seen[chunk.chunk] = chunk.timing.emitted_ns

    def last(self, session: str) -> int:
        return max(self.emitted[session], default=-1)

    def until(self, session: str, index: int) -> None:
        """Take chunks until ``session``'s chunk ``index`` has come."""
        deadline = time.monotonic() + TIMEOUT_S
        while self.last(session) < index:
            if time.monotonic() > deadline:
                raise RteError(f"bench_state: no chunk {index} of {session!r} in {TIMEOUT_S:g} s")
            self.take(0.2)

    def stall(self, session: str, since: int) -> float:
        """The largest gap between ``session``'s consecutive chunks from ``since``
        on, in periods (inf across a chunk never seen)."""
        seen = self.emitted[session]
        gaps = [
            (seen[i + 1] - seen[i]) / self.period_ns if i in seen and i + 1 in seen else np.inf
            for i in range(since, self.last(session))
        ]
        return float(max(gaps, default=np.inf))

    def gaps(self) -> int:
        """Chunk indices never seen between each session's first and last."""
        return sum(max(s) - min(s) + 1 - len(s) for s in self.emitted.values() if s)


@dataclass(frozen=True)
class Share:
    """What one drain client does: its sessions on ``full``, the ``spare`` they go
    to, and whether it drains them itself or ``follows`` a daemon-wide drain."""

    index: int
    full: str
    spare: str
    sessions: int
    period_ns: float
    follows: bool

    @property
    def names(self) -> list[str]:
        return [f"c{self.index}-s{j}" for j in range(self.sessions)]


class DrainClients:
    """``clients`` processes of ``per_client`` sessions each on daemon ``full``; see
    the module. :meth:`attached`, then :meth:`drain` once ``spare`` is up, then
    :meth:`close`. ``follows``: they do not drain, ``rte drain`` does (the
    caller's ``command`` to :meth:`drain`), and each moves its sessions when told."""

    def __init__(
        self,
        full: str,
        spare: str,
        clients: int,
        per_client: int,
        period_ns: float,
        *,
        follows: bool = False,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._attached = [context.Event() for _ in range(clients)]
        self._ready = [context.Event() for _ in range(clients)]
        self._joined, self._go = context.Event(), context.Event()
        self._out: multiprocessing.Queue[dict[str, Any]] = context.Queue()
        self._processes = []
        for i in range(clients):
            share = Share(i, full, spare, per_client, period_ns, follows)
            events = (self._attached[i], self._joined, self._ready[i], self._go)
            process = context.Process(
                target=_client, args=(share, *events, self._out), name=f"bench-state-drain-{i}"
            )
            process.daemon = True
            self._processes.append(process)
        for p in self._processes:
            p.start()

    def attached(self) -> None:
        """Wait until every client streams every session of its own."""
        self._wait(self._attached, "attached its sessions")

    def drain(self, command: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
        """The spare is up: take it in, then all drain the full daemon at once (or
        ``command`` drains it); each client's report."""
        self._joined.set()
        self._wait(self._ready, "taken in the spare daemon")
        self._go.set()
        command()
        reports = [self._report() for _ in self._processes]
        return sorted(reports, key=lambda r: int(r["client"]))

    def close(self) -> None:
        for p in self._processes:
            p.join(STEP_S if self._go.is_set() else 0.1)
            if p.is_alive():
                p.terminate()
                p.join(5)

    def _wait(self, events: list[Event], what: str) -> None:
        deadline = time.monotonic() + STEP_S
        while not all(e.is_set() for e in events):
            self._check()
            if time.monotonic() > deadline:
                raise RteError(f"bench_state: a drain client has not {what} in {STEP_S:g} s")
            time.sleep(0.05)

    def _check(self) -> None:
        """RteError with a client's own error, or for one that died."""
        try:
            report = self._out.get_nowait()
        except queue.Empty:
            dead = [p.name for p in self._processes if p.exitcode not in (None, 0)]
            if dead:
                raise RteError(f"bench_state: drain client {dead} died") from None
            return
        raise RteError(f"bench_state: a drain client failed early: {report}")

    def _report(self) -> dict[str, Any]:
        try:
            report = self._out.get(timeout=STEP_S)
        except queue.Empty:
            raise RteError(f"bench_state: a drain client did not report in {STEP_S:g} s") from None
        if "error" in report:
            raise RteError(f"bench_state: drain client {report['client']}: {report['error']}")
        return report


def _client(
    share: Share,
    attached: Event,
    joined: Event,
    ready: Event,
    go: Event,
    out: multiprocessing.Queue[dict[str, Any]],
) -> None:
    """One drain client (in a process of its own); see the module."""
    try:
        out.put(_drained(share, attached, joined, ready, go))
    except BaseException:  # told to the parent, whatever it was
        out.put({"client": share.index, "error": traceback.format_exc()})


def _drained(share: Share, attached: Event, joined: Event, ready: Event, go: Event) -> Any:
    names, spare = share.names, share.spare
    client = connect_pool([share.full, spare])  # the spare is down: missing, for now
    with client:
        streams = Streams(client, share.period_ns)
        for session in names:
            client.attach(session, {"prompt": "a forest"})
        for session in names:
            streams.until(session, 2)
        attached.set()
        _stream_until(streams, joined.is_set)
        client.attach(f"c{share.index}-probe")  # the pool takes in the spare at an attach
        client.detach(f"c{share.index}-probe")
        ready.set()
        _stream_until(streams, go.is_set)
        since = {s: streams.last(s) for s in names}
        began = time.monotonic()
        if share.follows:  # moved at the entry of a poll, once the daemon says so
            _stream_until(streams, lambda: all(client.home.get(s) == spare for s in names))
        else:
            client.drain(share.full, timeout=TIMEOUT_S)
        ended = time.monotonic()
        for session in names:
            streams.until(session, streams.last(session) + 2)
        elsewhere = [s for s in names if client.home.get(s) != spare]
        if elsewhere:
            raise RteError(f"not on the spare after the drain: {elsewhere}")
        return {
            "client": share.index,
            "began": began,
            "ended": ended,
            "moved": len(names),
            "stalls": [streams.stall(s, since[s]) for s in names],
            "gaps": streams.gaps(),
            "repeats": streams.repeats,
        }


def _stream_until(streams: Streams, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + STEP_S
    while not done():
        if time.monotonic() > deadline:
            raise RteError(f"bench_state: a drain client waited {STEP_S:g} s in vain")
        streams.take(0.02)
