"""Replay: a trace's session made again, and the first chunk that differs.

A trace (:mod:`rte.trace`) holds a session's attach, each action with the
chunk index it applied at, and a hash of every chunk. rte's engine is
deterministic, so the same model on the same device makes the same chunks if
each action is handed to it where it applied; a replay hands them there and
compares each chunk's hash and receipt with the trace's, in index order.

Two ways, flat out (never paced):

- :func:`replay_engine` steps an engine of this process itself, one step at a
  time, handing the actions of chunk ``c`` to the step that generates ``c``
  (the step after one that emitted chunk ``e`` generates ``e + depth``; after
  a step that generated nothing, the chunk it did not make). Exact: the
  receipts (:class:`rte.receipts.Receipts`, the daemon's own) are checked too.
- :func:`replay_client` drives a session through any client (a daemon's),
  with one credit: holding chunk ``e``, the session is not stepped, so the
  actions for ``e + depth`` are sent before ``e`` is released (after a heavy
  key's change, whose row sat out its encode, for the chunk it did not make).
  Actions of the first ``depth`` chunks are sent as soon as the session is
  attached, which a daemon may already have stepped: the receipts say when an
  action landed elsewhere, and the replay reports that chunk.

Either returns a :class:`Replayed`: chunks compared, the first
:class:`Divergence` if any, and the replay's speed beside the trace's pace.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from rte.client import EngineClient
from rte.contract import Action, Engine, ResultKind
from rte.errors import RteError
from rte.receipts import Receipts
from rte.trace import ActRecord, Trace, chunk_hash

REPLAY_TIMEOUT_S = 30.0  # the most a replay waits for any one chunk


class ReplayError(RteError):
    """A replay could not be run to its end: the engine failed or refused the
    session, or a chunk did not come in time. Not a divergence (that is a result)."""


@dataclass(frozen=True)
class Divergence:
    """The first chunk that differs: its index, what the trace and the replay say."""

    index: int
    want: str
    got: str
    what: str = "hash"  # "hash", "applied" (an action landed elsewhere) or "missing"

    def __str__(self) -> str:
        if self.what == "missing":
            return f"chunk {self.index}: in the trace ({self.want}), never made by the replay"
        if self.what == "applied":
            return (
                f"chunk {self.index}: applied action {self.got}, the trace's applied "
                f"{self.want} (an action landed at another chunk)"
            )
        return f"chunk {self.index}: trace {self.want}, replay {self.got}"


@dataclass(frozen=True)
class Replayed:
    """A replay's outcome: chunks compared, the first divergence, speed and pace."""

    chunks: int
    divergence: Divergence | None
    seconds: float
    pace: float | None  # the trace's chunks a second (None: too short to say)
    made: int = 0  # chunks the replay made (compared or not)

    @property
    def identical(self) -> bool:
        return self.divergence is None

    @property
    def speed(self) -> float:
        """The replay's chunks a second."""
        return self.made / self.seconds if self.seconds > 0 else float("inf")


def compare(trace: Trace, made: dict[int, tuple[str, int]], seconds: float) -> Replayed:
    """``made`` (index -> hash, applied seq as the trace numbers them) against ``trace``."""
    compared, pace, n = 0, trace.pace(), len(made)
    for record in trace.chunks:
        got = made.get(record.index)
        if got is None:
            divergence = Divergence(record.index, record.blake2b, "", "missing")
            return Replayed(compared, divergence, seconds, pace, n)
        if got[0] != record.blake2b:
            divergence = Divergence(record.index, record.blake2b, got[0])
            return Replayed(compared, divergence, seconds, pace, n)
        if got[1] != record.applied:
            divergence = Divergence(record.index, str(record.applied), str(got[1]), "applied")
            return Replayed(compared, divergence, seconds, pace, n)
        compared += 1
    return Replayed(compared, None, seconds, pace, n)


def _plan(trace: Trace) -> dict[int, list[ActRecord]]:
    """The actions to hand, by the chunk they applied at (refused ones, and those
    that applied at no chunk, are left out: they changed nothing recorded)."""
    plan: dict[int, list[ActRecord]] = defaultdict(list)
    for act in sorted(trace.acts, key=lambda a: a.seq):
        if act.refused is None and act.chunk is not None:
            plan[act.chunk].append(act)
    return plan


def _due(plan: dict[int, list[ActRecord]], upto: int) -> list[ActRecord]:
    """The planned actions of chunks up to ``upto`` (earlier ones are late: sent anyway)."""
    hand: list[ActRecord] = []
    for chunk in sorted(c for c in plan if c <= upto):
        hand += plan.pop(chunk)
    return hand


def _last(trace: Trace) -> int:
    return trace.chunks[-1].index if trace.chunks else -1


def replay_engine(trace: Trace, engine: Engine, *, timeout: float = REPLAY_TIMEOUT_S) -> Replayed:
    """Replay ``trace`` on ``engine`` (of this process, no session attached as the
    trace's), stepping it here; ReplayError if the engine fails the session."""
    session, manifest = trace.session, engine.manifest()
    ahead = manifest.pipeline_depth_chunks - 1
    receipts, plan, last = Receipts(manifest.pipelined), _plan(trace), _last(trace)
    made: dict[int, tuple[str, int]] = {}
    started = time.perf_counter()
    engine.attach(session, trace.conditioning)
    try:
        next_made, emitted, waited = 0, -1, time.monotonic()
        while emitted < last:
            hand = _due(plan, next_made)
            actions = None
            if hand:
                merged: dict[str, Any] = {}
                for act in hand:
                    merged.update(act.conditioning)  # as the serve loop merges them
                actions = {session: Action(merged)}
            receipts.settle()
            results = engine.step([session], actions)
            if hand:
                receipts.handed(results, {session: hand[-1].seq})
            for r in receipts.stamp(results):
                if r.session != session:
                    continue
                if r.kind is ResultKind.CHUNK:
                    assert r.latent is not None
                    made[r.chunk] = (chunk_hash(r.latent), r.applied)
                    emitted, next_made, waited = r.chunk, r.chunk + ahead + 1, time.monotonic()
                elif r.kind in (ResultKind.WARMUP, ResultKind.PENDING, ResultKind.ENCODING):
                    next_made = r.chunk
                else:
                    raise ReplayError(f"the engine failed session {session!r}: {r.error}")
            if time.monotonic() - waited > timeout:
                raise ReplayError(f"no chunk {emitted + 1} of {session!r} in {timeout:g} s")
    finally:
        engine.detach(session)
    return compare(trace, made, time.perf_counter() - started)


def replay_client(
    trace: Trace,
    client: EngineClient,
    *,
    heavy_keys: list[str] | None = None,
    timeout: float = REPLAY_TIMEOUT_S,
) -> Replayed:
    """Replay ``trace`` through ``client`` (see the module's docstring).
    ``heavy_keys``: the model's (default: the trace's header's, else none)."""
    session, depth = trace.session, client.manifest.pipeline_depth_chunks
    heavy = set(heavy_keys if heavy_keys is not None else trace.header.get("heavy_keys") or [])
    plan, last = _plan(trace), _last(trace)
    made: dict[int, tuple[str, int]] = {}
    to_trace: dict[int, int] = {0: 0}  # the replay's seqs -> the trace's
    started = time.perf_counter()
    client.attach(session, trace.conditioning, credits=1, priority=trace.priority)
    try:
        handed_at, heavy_handed = _send(client, session, _due(plan, depth - 1), to_trace), False
        emitted = -1
        while emitted < last:
            chunk = client.poll(timeout)
            if chunk is None:
                raise ReplayError(f"no chunk {emitted + 1} of {session!r} in {timeout:g} s")
            with chunk:
                if chunk.session != session:
                    continue
                made[chunk.chunk] = (chunk_hash(chunk.latent), to_trace.get(chunk.applied, -1))
                emitted = chunk.chunk
                next_made = emitted + depth
                if heavy_handed and handed_at is not None and emitted < handed_at:
                    next_made = handed_at  # its row sat out the encode: that chunk is next
                hand = _due(plan, next_made)
                if hand:
                    heavy_handed = any(heavy & act.conditioning.keys() for act in hand)
                    handed_at = _send(client, session, hand, to_trace)
    finally:
        client.detach(session)
    return compare(trace, made, time.perf_counter() - started)


def _send(
    client: EngineClient, session: str, hand: list[ActRecord], to_trace: dict[int, int]
) -> int | None:
    """Send ``hand`` in order; the chunk the last is planned for (None: none sent)."""
    for act in hand:
        to_trace[client.act(session, act.conditioning)] = act.seq
    return hand[-1].chunk if hand else None
