"""Interactive callers for the real-time benchmark, each a process of its own.

A caller connects to one or more daemons and plays many sessions the way an
interactive front end does: it takes every step's batch as it arrives and
releases it at once, sends a move to each session every ``act_every_s``, and
keeps per session what a user would feel: when each chunk was emitted (the
chunk's own ``emitted_ns``, on the daemon's clock, which is this machine's
``CLOCK_MONOTONIC``), when the first one was taken, and how long each action
took to show (an act's send to the first chunk taken whose ``applied`` receipt
is at least its ``seq``). The driver (:mod:`tools.bench_realtime`) tells it
what to do over a pipe, one command at a time, and reads what it kept.

Commands (tuples; the first item names it), each answered by one reply:

* ``("attach", [(session, priority, lifetime_s | None), ...], wait_s)``: attach
  each (``priority`` None: the default), refused ones answered as such; a
  session with a lifetime is detached by the caller itself when it ends.
* ``("collect",)``: every live session's track so far (kept going).
* ``("finished",)``: the tracks of the sessions that ended since the last call.
* ``("detach_all",)``: detach every session; their tracks.
* ``("stop",)``: close and exit.

:class:`Callers` starts ``n`` of them and asks them things, each in turn or all
at once.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import random
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from rte.client import EngineClient, connect
from rte.errors import AdmissionError, RteError

MOVES = [[1, 0], [0, 1], [-1, 0], [0, -1]]
Wanted = tuple[str, int | None, float | None]  # session, priority, lifetime in s
CALLERS_AT_MOST = 1000  # a caller's seed is this plus its index


@dataclass
class Track:
    """What one session's caller saw (plain values: it crosses the pipe)."""

    session: str
    priority: int | None
    daemon: int = 0  # which of the caller's daemons it lives on
    attach_sent_ns: int = 0
    first_taken_ns: int = 0
    ended_ns: int = 0
    emitted: list[int] = field(default_factory=list)  # per chunk, ns
    photon_ns: list[int] = field(default_factory=list)  # act sent -> chunk applying it taken
    notices: list[str] = field(default_factory=list)  # kinds of notices about it (REDUCED...)
    end_ns: int = 0  # when the caller detaches it (0: never)
    pending: list[tuple[int, int]] = field(default_factory=list)  # (seq, sent ns)
    next_act_ns: int = 0


class Caller:
    """One caller process's sessions over its clients (one per daemon name)."""

    def __init__(self, names: list[str], act_every_s: float, seed: int, stride: int = 1) -> None:
        self.clients: list[EngineClient] = [connect(n, timeout=60) for n in names]
        self.act_every_ns = int(act_every_s * 1e9)
        self.random = random.Random(seed)
        self.live: dict[str, Track] = {}
        self.done: list[Track] = []
        # caller i of n puts its k-th session on daemon i + k*n: n callers cover them all
        self._next_daemon, self._stride = seed % CALLERS_AT_MOST, stride

    def attach(
        self, wanted: list[tuple[str, int | None, float | None]], wait_s: float
    ) -> list[Any]:
        answers = []
        for session, priority, lifetime in wanted:
            daemon = self._next_daemon % len(self.clients)
            self._next_daemon += self._stride
            track = Track(session, priority, daemon)
            track.attach_sent_ns = time.monotonic_ns()
            options: dict[str, Any] = {} if priority is None else {"priority": priority}
            if wait_s:
                options["wait"] = wait_s
            try:
                self.clients[daemon].attach(session, {"prompt": "a green valley"}, **options)
            except AdmissionError as exc:
                answers.append((session, False, str(exc)))
                continue
            except RteError as exc:
                answers.append((session, False, f"{type(exc).__name__}: {exc}"))
                continue
            now = time.monotonic_ns()
            track.end_ns = now + int(lifetime * 1e9) if lifetime else 0
            track.next_act_ns = now + self.random.randrange(max(1, self.act_every_ns))
            self.live[session] = track
            answers.append((session, True, ""))
        return answers

    def turn(self) -> None:
        """Take what arrived on every client, release it, act and end sessions as due."""
        took = False
        for client in self.clients:
            batch = client.poll_batch(timeout=0)
            if batch is None:
                continue
            took = True
            with batch:
                self._record(batch)
            for notice in client.notices():
                track = self.live.get(notice.session)
                if track is not None:
                    track.notices.append(notice.kind.name)
        now = time.monotonic_ns()
        for track in list(self.live.values()):
            if track.end_ns and now >= track.end_ns:
                self._detach(track)
            elif now >= track.next_act_ns:
                self._act(track, now)
        if not took:  # nothing waited: sleep on the first client (a real wait)
            batch = self.clients[0].poll_batch(timeout=0.002) if len(self.clients) == 1 else None
            if batch is not None:
                with batch:
                    self._record(batch)
            elif len(self.clients) > 1:
                time.sleep(0.0005)

    def _record(self, batch: Any) -> None:
        taken = batch.taken_ns
        applied = getattr(batch, "applied", None)
        for i, session in enumerate(batch.sessions):
            track = self.live.get(session)
            if track is None:
                continue
            if not track.emitted:
                track.first_taken_ns = taken
            track.emitted.append(batch.emitted_ns)
            if track.pending and applied is not None:
                seq = int(applied[i])
                while track.pending and track.pending[0][0] <= seq:
                    track.photon_ns.append(taken - track.pending.pop(0)[1])

    def _act(self, track: Track, now: int) -> None:
        track.next_act_ns = now + self.act_every_ns
        client = self.clients[track.daemon]
        try:
            seq = client.act(track.session, {"move": self.random.choice(MOVES)})
        except RteError:
            return
        if isinstance(seq, int) and len(track.pending) < 64:
            track.pending.append((seq, time.monotonic_ns()))

    def _detach(self, track: Track) -> None:
        with contextlib.suppress(RteError):
            self.clients[track.daemon].detach(track.session)
        track.ended_ns = time.monotonic_ns()
        self.done.append(self.live.pop(track.session))

    def detach_all(self) -> list[Track]:
        for track in list(self.live.values()):
            self._detach(track)
        done, self.done = self.done, []
        return done

    def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(RteError):
                client.close()


def serve(
    conn: Connection, names: list[str], act_every_s: float, seed: int, stride: int = 1
) -> None:
    """A caller process's main: connect, answer ``ready``, then obey the driver."""
    try:
        caller = Caller(names, act_every_s, seed, stride)
    except Exception as exc:  # the driver says why
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", ""))
    try:
        while True:
            while conn.poll(0):
                command = conn.recv()
                match command[0]:
                    case "attach":
                        conn.send(caller.attach(command[1], command[2]))
                    case "collect":
                        conn.send(list(caller.live.values()))
                    case "finished":
                        done, caller.done = caller.done, []
                        conn.send(done)
                    case "detach_all":
                        conn.send(caller.detach_all())
                    case "stop":
                        return
            caller.turn()
    finally:
        caller.close()


class Callers:
    """``n`` caller processes over the daemons ``names`` (each caller connects to all)."""

    def __init__(self, names: list[str], n: int, act_every_s: float) -> None:
        context = mp.get_context("spawn")
        self.pipes = []
        self.processes = []
        for i in range(n):
            ours, theirs = context.Pipe()
            args = (theirs, names, act_every_s, CALLERS_AT_MOST + i, n)
            process = context.Process(target=serve, args=args, daemon=True)
            process.start()
            self.pipes.append(ours)
            self.processes.append(process)
        for pipe in self.pipes:
            if not pipe.poll(90):
                raise RuntimeError("a caller did not connect in 90 s")
            state, why = pipe.recv()
            if state != "ready":
                raise RuntimeError(f"a caller could not connect: {why}")

    def ask(self, i: int, *command: Any) -> Any:
        self.pipes[i].send(command)
        if not self.pipes[i].poll(120):
            raise RuntimeError(f"caller {i} did not answer {command[0]!r} in 120 s")
        return self.pipes[i].recv()

    def everyone(self, *command: Any) -> list[Any]:
        for pipe in self.pipes:
            pipe.send(command)
        out = []
        for i, pipe in enumerate(self.pipes):
            if not pipe.poll(120):
                raise RuntimeError(f"caller {i} did not answer {command[0]!r} in 120 s")
            out += pipe.recv()
        return out

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):  # a caller that died has closed its end
                pipe.send(("stop",))
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join(10)
