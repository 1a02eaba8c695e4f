"""End to end: action sent to the chunk that reflects it, through a daemon and in process.

Does the process boundary add latency against a direct in-process callback? The
model is the null model (zero-cost stages) whose chunks carry the session's
last ``tag``; a round sends a new tag to one session (round r: session r mod n)
and times, on ``time.monotonic_ns``, until a chunk of that session carries it.

* in process: ``ComposedEngine.step`` in a loop on this thread that hands each
  chunk to a callback (a direct in-process callback; :mod:`tools.e2e_inprocess`);
* daemon: ``rte serve --model null`` in another process, the action over the
  inbox ring, the chunk back over the outbox ring and the slab, held when
  ``client.poll_batch()`` returns its step's batch (the batch API: one record,
  one release per step).

Two modes, one row per (sessions, mode):

* ``flat``: both step as fast as they can. Also chunks/s flat out: the
  in-process loop with its callback, and a client draining the daemon. Flat
  rows measure the daemon with both client APIs: the batch API above, and the
  per-chunk API (``client.poll()`` and ``chunk.release()`` per chunk, the
  README's first snippet): ``chunk_api_*`` its act-to-chunk latency and
  chunks/s, ``batch_x``/``chunk_x`` each API's chunks/s over the in-process
  loop's (issue 27's targets: 0.9x and 0.8x at 64 sessions).
* ``paced``: 60 Hz. The daemon is a second one, ``rte serve --pace-hz 60``;
  the in-process side is a paced loop of this module around the same
  ``ComposedEngine.step`` and callback (it sleeps to each tick as
  ``rte.serve.default_serve`` does), so ``added`` means the same in both
  modes: what the process boundary adds. (``InProcessClient(pace_hz=60)``
  would add its own thread handoff.) An action is sent at a set point of the
  period after the emission of the chunk that ended the last round (``R``
  evenly spaced points for ``R`` rounds, the same points in both paths and
  every window), so the latency includes the wait for the next tick: about
  1.5 periods at p50. After the rounds, a steady window records chunks/s,
  each chunk's delivery (``timing.emitted_ns`` to the client holding it; in
  process, to the callback) and the client's CPU time (``time.process_time``
  over the window, % of one core; in process that is the engine's too).

Every figure is the median over ``--windows`` windows (``*_spread``: the half-range
in % of the median). Window i runs in process then through the daemon; ``added`` is
per window. Paced chunks/s count a short window (1/30 quantization at 0.5 s).

    python -m tools.bench_e2e [--sessions 1 8 64] [--windows 5] [--rounds 200]
                              [--paced-rounds 12] [--json] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rte.client import ChunkBatch, EngineClient
from rte.errors import RteError
from rte.launch import START_TIMEOUT_S, LaunchedDaemon, Progress, unique_name
from rte.models.null import tag_of
from tools import report
from tools.e2e_inprocess import action_points, due_at, in_process

PACE_HZ = 60.0
TIMEOUT_S = 10.0  # every wait for a chunk
FLAT = ["inproc_p50_us", "inproc_p99_us", "daemon_p50_us", "daemon_p99_us"]
FLAT += ["added_p50_us", "added_p99_us", "inproc_chunks_per_s", "daemon_chunks_per_s"]
PER_CHUNK = ["chunk_api_p50_us", "chunk_api_p99_us", "chunk_api_chunks_per_s"]
PER_CHUNK += ["batch_x", "chunk_x"]
PACED = [*FLAT, "held_p50_us", "held_p99_us", "client_cpu_pct"]
PACED += ["inproc_held_p50_us", "inproc_held_p99_us", "inproc_cpu_pct"]
TITLE = "Action to the chunk that reflects it (null model)"
TABLES: list[report.TableSpec] = [
    (f"{TITLE}, flat", "rows", {"mode": "flat"}, ["sessions", *FLAT, *PER_CHUNK]),
    (f"{TITLE}, paced at 60 Hz", "rows", {"mode": "paced"}, ["sessions", *PACED]),
]
Tags = Iterator[int]


# -- through a daemon ------------------------------------------------------------


class Daemon(LaunchedDaemon):
    """``rte serve --model MODEL [ARGS]`` with the benchmark's rows, clients, slots
    and quota (a later option wins); :meth:`close` stops it and removes its shared
    memory, whatever state it is in."""

    def __init__(
        self,
        sessions: int,
        pace_hz: float = 0,
        prefix: str = "bench",
        model: str = "null",
        args: Sequence[str] = (),
    ) -> None:
        options = ["--model", model, "--max-sessions", str(sessions), "--max-clients", "2"]
        options += ["--slab-slots", str(4 * sessions + 8), "--quota", str(2 * sessions + 4)]
        options += [*(["--pace-hz", str(pace_hz)] if pace_hz else []), *args]
        super().__init__(unique_name(prefix), options)

    def connect(
        self, timeout: float = START_TIMEOUT_S, progress: Progress | None = None
    ) -> EngineClient:
        """A client once it is ready; RuntimeError with its last 2000 characters if not."""
        try:
            return super().connect(timeout, progress)
        except RteError as exc:
            tail = self.said()[-2000:]
            raise RuntimeError(f"the benchmark's daemon did not come up: {exc}\n{tail}") from exc

    def close(self) -> None:
        self.stop()


def _settle(client: EngineClient, sessions: int) -> int:
    """Fill the pipeline, then take what waits; the last batch's ``emitted_ns``."""
    emitted = 0
    for _ in range(4):
        with _batch(client) as batch:
            emitted = batch.emitted_ns
    while (waiting := client.poll_batch(timeout=0)) is not None:
        with waiting:
            emitted = waiting.emitted_ns
    return emitted


def _batch(client: EngineClient) -> ChunkBatch:
    batch = client.poll_batch(timeout=TIMEOUT_S)
    if batch is None:
        raise RuntimeError(f"no chunk from the daemon in {TIMEOUT_S}s")
    return batch


def _drain_until(client: EngineClient, session: str, tag: int) -> tuple[int, int]:
    """Take step batches until a chunk of ``session`` carries ``tag``: (held ns, its
    emitted ns). A batch's rows are looked at in place, as a caller would."""
    while True:
        with _batch(client) as batch:
            for i, name in enumerate(batch.sessions):
                if name == session and tag_of(batch.latents[i]) == tag:
                    return time.monotonic_ns(), batch.emitted_ns


def _chunk_until(client: EngineClient, session: str, tag: int) -> tuple[int, int]:
    """:func:`_drain_until` through the per-chunk API: a chunk at a time, each released."""
    while True:
        chunk = client.poll(timeout=TIMEOUT_S)
        if chunk is None:
            raise RuntimeError(f"no chunk from the daemon in {TIMEOUT_S}s")
        with chunk:
            if chunk.session == session and tag_of(chunk.latent) == tag:
                return time.monotonic_ns(), chunk.timing.emitted_ns


def _chunk_count(client: EngineClient, seconds: float) -> int:
    """Take and release chunks one at a time (``poll`` and ``release`` per chunk)
    as fast as they come for ``seconds``; how many came."""
    count = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        chunk = client.poll(timeout=left)
        if chunk is not None:
            chunk.release()
            count += 1
    return count


def _drain_count(client: EngineClient, seconds: float, held: list[int] | None = None) -> int:
    """Take and release step batches as fast as they come for ``seconds`` (the batch
    API: one release per step); how many chunks came. With ``held``, append each
    batch's :func:`_delivery_ns` to it, once per chunk."""
    count = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        batch = client.poll_batch(timeout=left)
        if batch is None:
            continue
        held_ns = time.monotonic_ns()
        if held is not None:
            held += [_delivery_ns(batch, held_ns)] * len(batch)
        batch.release()
        count += len(batch)
    return count


def flat_out(client: EngineClient, seconds: float) -> int:
    """Chunks taken in ``seconds``, flat out, released a batch at a time (the
    chunks/s of tools.bench_scale and tools.bench_ray)."""
    count, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        batch = client.poll_batch(timeout=0.1)
        if batch is not None:
            count += len(batch)
            batch.release()
    return count


def tag_round(client: EngineClient, session: str, tag: int) -> int:
    """Act ``tag`` on ``session``, then take batches until a chunk of it carries
    ``tag`` (null model): ns (the latency of tools.bench_scale and tools.bench_ray)."""
    sent = time.monotonic_ns()
    client.act(session, {"tag": tag})
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        batch = client.poll_batch(timeout=0.1)
        if batch is None:
            continue
        with batch:
            for i, name in enumerate(batch.sessions):
                if name == session and tag_of(batch.latents[i]) == tag:
                    return time.monotonic_ns() - sent
    raise RuntimeError(f"no chunk of {session} carried tag {tag} in {TIMEOUT_S}s")


def _delivery_ns(batch: ChunkBatch, held_ns: int) -> int:
    """Delivery latency of a step's chunks: the engine's step returned them
    (``emitted_ns``) to the client holding them (``held_ns``, ``time.monotonic_ns``
    after the poll). ``pushed_ns``/``taken_ns`` split it (``rte inspect`` shows that)."""
    return held_ns - batch.emitted_ns


def _consume_until(client: EngineClient, at_ns: int) -> None:
    """Take and release what comes until ``at_ns``, as an interactive caller (and
    the in-process callback) does: a chunk left unread holds its session's credit."""
    while (left := at_ns - time.monotonic_ns()) > 0:
        batch = client.poll_batch(timeout=left / 1e9)
        if batch is not None:
            batch.release()


def through_daemon(
    client: EngineClient,
    names: list[str],
    rounds: int,
    tags: Tags,
    period_ns: int = 0,
    per_chunk: bool = False,
) -> list[int]:
    """Per-round ns from act to the client holding the tagged chunk. Paced
    (``period_ns``): each action at the points of :func:`action_points`. ``per_chunk``:
    the chunks are taken by the per-chunk API (else a step's batch at a time)."""
    until = _chunk_until if per_chunk else _drain_until
    anchor = _settle(client, len(names))
    phases = action_points(rounds, period_ns) if period_ns else []
    samples = []
    for r in range(rounds):
        session, tag = names[r % len(names)], next(tags)
        if period_ns:
            _consume_until(client, due_at(anchor, phases[r], period_ns))
        t0 = time.monotonic_ns()
        client.act(session, {"tag": tag})
        held_ns, anchor = until(client, session, tag)
        samples.append(held_ns - t0)
    return samples


# -- windows and rows --------------------------------------------------------------


def _latency(local: list[int], remote: list[int]) -> dict[str, float]:
    a, b = report.percentiles_us(local), report.percentiles_us(remote)
    return {
        "inproc_p50_us": a["p50_us"],
        "inproc_p99_us": a["p99_us"],
        "daemon_p50_us": b["p50_us"],
        "daemon_p99_us": b["p99_us"],
        "added_p50_us": b["p50_us"] - a["p50_us"],
        "added_p99_us": b["p99_us"] - a["p99_us"],
    }


def _flat_window(
    client: EngineClient, names: list[str], rounds: int, seconds: float, tags: Tags
) -> dict[str, float]:
    local = in_process(len(names), rounds, seconds)
    remote = through_daemon(client, names, rounds, tags)
    rate = _drain_count(client, seconds) / seconds
    by_chunk = report.percentiles_us(through_daemon(client, names, rounds, tags, per_chunk=True))
    chunk_rate = _chunk_count(client, seconds) / seconds
    rates = {"inproc_chunks_per_s": local["rate"], "daemon_chunks_per_s": rate}
    per_chunk = {
        "chunk_api_p50_us": by_chunk["p50_us"],
        "chunk_api_p99_us": by_chunk["p99_us"],
        "chunk_api_chunks_per_s": chunk_rate,
        "batch_x": rate / local["rate"],
        "chunk_x": chunk_rate / local["rate"],
    }
    return {**_latency(local["samples"], remote), **rates, **per_chunk}


def _paced_window(
    client: EngineClient, names: list[str], rounds: int, seconds: float, tags: Tags
) -> dict[str, float]:
    local = in_process(len(names), rounds, seconds, PACE_HZ)
    remote = through_daemon(client, names, rounds, tags, round(1e9 / PACE_HZ))
    while (waiting := client.poll_batch(timeout=0)) is not None:  # the rest of the last step
        waiting.release()
    held: list[int] = []
    cpu, began = time.process_time(), time.monotonic()
    count = _drain_count(client, seconds, held)
    cpu_pct = (time.process_time() - cpu) / (time.monotonic() - began) * 100
    ours, theirs = report.percentiles_us(held), report.percentiles_us(local["held"])
    return {
        **_latency(local["samples"], remote),
        "inproc_chunks_per_s": local["rate"],
        "daemon_chunks_per_s": count / seconds,
        "held_p50_us": ours["p50_us"],
        "held_p99_us": ours["p99_us"],
        "client_cpu_pct": cpu_pct,
        "inproc_held_p50_us": theirs["p50_us"],
        "inproc_held_p99_us": theirs["p99_us"],
        "inproc_cpu_pct": local["cpu"],
    }


def measure(
    sessions: int,
    mode: str,
    n_windows: int,
    rounds: int,
    seconds: float,
    progress: report.Progress,
    prefix: str = "bench",
) -> dict[str, Any]:
    """One row: a daemon for this (sessions, mode), ``n_windows`` windows, their summary."""
    daemon = Daemon(sessions, PACE_HZ if mode == "paced" else 0.0, prefix)
    try:
        with daemon.connect() as client:
            names = [f"s{i}" for i in range(sessions)]
            for name in names:
                client.attach(name)
            window = _paced_window if mode == "paced" else _flat_window
            measure = functools.partial(window, client, names, rounds, seconds, itertools.count())
            what = f"sessions={sessions} {mode}"
            summary = progress.measure(what, measure, n_windows, "daemon_p50_us", "µs")
    finally:
        daemon.close()
    return {"sessions": sessions, "mode": mode, **summary}


def run(
    sizes: list[int],
    rounds: int = 200,
    *,
    n_windows: int = report.DEFAULT_WINDOWS,
    paced_rounds: int = 12,
    rate_seconds: float = 0.5,
    paced_seconds: float = 0.5,
    modes: tuple[str, ...] = ("flat", "paced"),
    prefix: str = "bench",
) -> dict[str, Any]:
    """Every (mode, sessions) row, flat rows first. Counts and seconds are per window."""
    progress = report.Progress("e2e", len(modes) * len(sizes))
    rows = []
    for mode in modes:
        count, seconds = (
            (paced_rounds, paced_seconds) if mode == "paced" else (rounds, rate_seconds)
        )
        for n in sizes:
            rows.append(
                measure(n, mode, n_windows, count, seconds, prefix=prefix, progress=progress)
            )
    return {
        "bench": "end_to_end",
        "machine": report.machine(),
        "windows": n_windows,
        "rounds": rounds,
        "paced_rounds": paced_rounds,
        "pace_hz": PACE_HZ,
        "rate_seconds": rate_seconds,
        "paced_seconds": paced_seconds,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--windows", type=int, default=report.DEFAULT_WINDOWS)
    parser.add_argument("--rounds", type=int, default=200, help="flat rounds per window")
    parser.add_argument("--paced-rounds", type=int, default=12, help="paced rounds per window")
    parser.add_argument("--rate-seconds", type=float, default=0.5, help="flat chunks/s window")
    parser.add_argument("--paced-seconds", type=float, default=0.5, help="paced steady window")
    parser.add_argument("--modes", nargs="+", choices=["flat", "paced"], default=["flat", "paced"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", metavar="FILE.png", help="p50/p99 per sessions and mode, log y")
    args = parser.parse_args(argv)
    result = run(
        args.sessions,
        args.rounds,
        n_windows=args.windows,
        paced_rounds=args.paced_rounds,
        rate_seconds=args.rate_seconds,
        paced_seconds=args.paced_seconds,
        modes=tuple(args.modes),
    )
    if args.plot:
        report.plot_latency(result, args.plot)
    report.emit(result, TABLES, args.json)


if __name__ == "__main__":
    main()
