"""The actors: one :class:`DaemonHost` per GPU (per node here) owning an ``rte serve``
daemon on its node, and the :class:`Router` that maps sessions to them.

A DaemonHost starts its daemon as a :class:`~rte.launch.LaunchedDaemon`, in a
session of its own, that dies with it (:mod:`rte.launch.parentdeath`): the
kernel sends it SIGTERM when the actor's process ends, even by SIGKILL (a
node's processes killed at once), and it then finalizes its sessions and
unlinks its shared memory.
(Ray would SIGKILL a worker's children with it:
:func:`rte.ray.cluster.loopback_environment` turns that off, as
``RAY_kill_child_processes_on_worker_exit=0`` does for a cluster started by
hand.) Callers on the same node attach to that daemon through shared memory,
by its name, exactly as any local client; for each caller elsewhere the host
holds a client slot of its own (a :class:`~rte.ray.relay.Relay`): it relays the
caller's requests and pushes its arrivals, a message per wake-up, through an
async generator (Ray's streaming generator of an async actor method).

The Router admits a session to the live host with the most free rows and keeps
it there (sticky: :mod:`rte.placement`, the pool's policy too); a thread of it
asks every host for its health each :data:`HEALTH_EVERY_S`, and a host that
does not answer (its node is gone) has its sessions reported lost to their
owners (:meth:`Router.lost`), who may attach them again: the router then
admits them elsewhere.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from rte.client import ShmClient
from rte.contract import Manifest
from rte.errors import AdmissionError
from rte.launch import LaunchedDaemon
from rte.placement import Placement
from rte.protocol.requests import Request
from rte.ray.relay import Ended, Message, Relay
from rte.ray.window import WINDOW

HEALTH_EVERY_S = 0.5
HEALTH_TIMEOUT_S = 2.0
MISSES = 3  # checks a live actor may fail in a row (busy, or its daemon gone) before it is lost


class DaemonHost:
    """``rte serve --name NAME ARGS`` on this actor's node, and a :class:`Relay` of it
    per caller elsewhere. An async actor (its relays stream on its event loop)."""

    def __init__(self, name: str, args: list[str]) -> None:
        import ray  # noqa: PLC0415 (an actor: Ray is there)

        self.name = name
        self.node = ray.get_runtime_context().get_node_id()
        # a session of its own: a kill of the actor's process group spares it (it cleans up)
        self.daemon = LaunchedDaemon(name, args, own_session=True)
        client = self.daemon.connect()
        assert isinstance(client, ShmClient)
        self.client = client  # this host's own look at the daemon (its roster, its manifest)
        self.relays: dict[str, Relay] = {}  # caller -> its client slot here

    def where(self) -> tuple[str, str]:
        """(daemon name, node id): the health check, too (it fails when the daemon
        has exited, not only when this actor is gone)."""
        code = self.daemon.process.poll()
        if code is not None:
            raise RuntimeError(
                f"daemon {self.name!r} exited with {code}: {self.daemon.last_words()}"
            )
        return self.name, self.node

    def free_rows(self) -> int:
        return self.client.free_rows()

    def manifest(self) -> Manifest:
        return self.client.manifest

    def pid(self) -> int:
        """This actor's process (for a test that stops it)."""
        return os.getpid()

    def relayed(self, owner: str) -> dict[str, int]:
        """What this host relayed for caller ``owner``: messages pushed, steps in
        them, calls that gave rows back."""
        relay = self.relays.get(owner)
        return dict(relay.counts) if relay is not None else {}

    # -- relays for callers elsewhere -------------------------------------------

    def open(self, owner: str, window: int = WINDOW) -> Manifest:
        """A client slot at the daemon for caller ``owner`` (its own: its chunks
        only), each session ``window`` chunks ahead of it at most beyond its credits."""
        relay = self.relays.get(owner)
        if relay is None or relay.closed:
            relay = self.relays[owner] = Relay(self.name, window=window)
        return relay.manifest

    async def stream(self, owner: str) -> AsyncIterator[Message]:
        """Caller ``owner``'s arrivals, pushed: a message per wake-up (see :class:`Relay`)."""
        relay = self.relays.get(owner)
        if relay is None:
            yield [Ended(f"caller {owner!r} has no slot at daemon {self.name!r}: open first")]
            return
        async for message in relay.stream():
            yield message

    async def send(self, owner: str, request: Request, room_s: float = 0.0) -> None:
        relay = self.relays.get(owner)
        if relay is not None:
            await relay.send(request, room_s)

    def give_back(self, owner: str, releases: list[tuple[int, np.ndarray[Any, Any]]]) -> None:
        relay = self.relays.get(owner)
        if relay is not None:
            relay.give_back(releases)

    def close(self, owner: str) -> None:
        """Caller ``owner`` leaves: its slot (and so its sessions) too."""
        relay = self.relays.pop(owner, None)
        if relay is not None:
            relay.close()

    def stop(self) -> int:
        """Leave and stop the daemon (it finalizes and unlinks; killed after a grace
        period, and what it left removed); its exit code."""
        for owner in list(self.relays):
            self.close(owner)
        self.client.close()
        return self.daemon.stop()


class Router:
    """Sessions to hosts: admission by free rows, sticky, losses reported."""

    def __init__(self, hosts: list[Any]) -> None:
        self.hosts = hosts
        self.live = set(range(len(hosts)))
        self.placement: Placement[int] = Placement()  # session -> host, with its owner
        self.lost_by: dict[str, list[tuple[str, int]]] = {}  # owner -> (session, host) lost
        self.misses: dict[int, int] = {}  # host -> health checks failed in a row
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def admit(self, session: str, owner: str) -> int:
        """The host ``session`` lives on (chosen now by :mod:`rte.placement`: the live
        one with most free rows, then fewest of ``owner``'s sessions)."""
        import ray  # noqa: PLC0415

        with self.lock:
            if session in self.placement:
                return self.placement[session]
            live = sorted(self.live)
        rows = {}
        for index in live:
            try:
                rows[index] = ray.get(
                    self.hosts[index].free_rows.remote(), timeout=HEALTH_TIMEOUT_S
                )
            except Exception:  # a host that cannot say is not a place for a session
                continue
        with self.lock:  # (a host lost meanwhile is not a choice)
            choices = self.placement.choices(
                session, rows, owner=owner, live=self.live.__contains__
            )
            # none with room by the rosters: one may lag a detach (a daemon publishes
            # its roster a moment later), so the first live one is asked all the same
            # and its own refusal is the one the caller gets (then it releases here)
            choices += [i for i in rows if i in self.live and i not in choices]
            if choices:
                self.placement.settle(session, choices[0], owner)
                return choices[0]
        raise AdmissionError(
            f"session {session!r} refused: no live host of the cluster answered "
            f"({len(live)} live of {len(self.hosts)}); attach again when one is up"
        )

    def release(self, session: str) -> None:
        with self.lock:
            self.placement.release(session)

    def settle(self, session: str, index: int, owner: str) -> None:
        """``session`` (``owner``'s) now lives on host ``index``: a move's target,
        chosen by its caller (a daemon that refuses it is released again)."""
        with self.lock:
            self.placement.release(session)
            self.placement.settle(session, index, owner)

    def lost(self, owner: str) -> list[tuple[str, int]]:
        """The sessions of ``owner`` whose host died since it last asked, each with
        that host (a session admitted again since lives elsewhere: not lost)."""
        with self.lock:
            return self.lost_by.pop(owner, [])

    def forsake(self, index: int) -> None:
        """A caller found host ``index`` gone (its stream ended, its daemon's FIFO
        closed): it is lost now, before the health checks say so."""
        self._lose(index)

    def hosts_alive(self) -> list[int]:
        with self.lock:
            return sorted(self.live)

    def _watch(self) -> None:
        import ray  # noqa: PLC0415

        while True:
            time.sleep(HEALTH_EVERY_S)
            for index in sorted(self.live):
                try:
                    ray.get(self.hosts[index].where.remote(), timeout=HEALTH_TIMEOUT_S)
                    self.misses[index] = 0
                except ray.exceptions.RayActorError:  # the actor (its node) is gone
                    self._lose(index)
                except Exception:  # slow (busy), or its daemon exited: three in a row
                    self.misses[index] = self.misses.get(index, 0) + 1
                    if self.misses[index] >= MISSES:
                        self._lose(index)

    def _lose(self, index: int) -> None:
        with self.lock:
            if index not in self.live:
                return
            self.live.discard(index)
            for session, owner in self.placement.lose(index):
                self.lost_by.setdefault(owner, []).append((session, index))
