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
by its name, exactly as any local client; for callers elsewhere the host is
their client of it: it attaches, acts, and hands out chunks copied into Ray's
object store.

The Router admits a session to the live host with the most free rows and keeps
it there (sticky: :mod:`rte.placement`, the pool's policy too); a thread of it
asks every host for its health each :data:`HEALTH_EVERY_S`, and a host that
does not answer (its node is gone) has its sessions reported lost to their
owners (:meth:`Router.lost`), who may attach them again: the router then
admits them elsewhere.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from rte.client import ShmClient
from rte.errors import AdmissionError
from rte.launch import LaunchedDaemon
from rte.placement import Placement

HEALTH_EVERY_S = 0.5
HEALTH_TIMEOUT_S = 2.0
MISSES = 3  # checks a live actor may fail in a row (busy, or its daemon gone) before it is lost


class DaemonHost:
    """``rte serve --name NAME ARGS`` on this actor's node, and a client of it."""

    def __init__(self, name: str, args: list[str]) -> None:
        import ray  # noqa: PLC0415 (an actor: Ray is there)

        self.name = name
        self.node = ray.get_runtime_context().get_node_id()
        # a session of its own: a kill of the actor's process group spares it (it cleans up)
        self.daemon = LaunchedDaemon(name, args, own_session=True)
        client = self.daemon.connect()
        assert isinstance(client, ShmClient)
        self.client = client  # for callers on other nodes
        self.owner: dict[str, str] = {}  # session -> the caller it streams to
        self.waiting: dict[str, list[tuple[Any, int]]] = {}  # owner -> (batch, row) held

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

    def attach(
        self, session: str, conditioning: dict[str, Any], owner: str = "", credits: int = 0
    ) -> None:
        self.client.attach(session, conditioning, credits=credits)
        self.owner[session] = owner

    def act(self, session: str, conditioning: dict[str, Any]) -> None:
        self.client.act(session, conditioning)

    def detach(self, session: str) -> None:
        self.client.detach(session)
        self.owner.pop(session, None)

    def take(self, owner: str, wait: float = 0.05) -> list[tuple[str, int, np.ndarray[Any, Any]]]:
        """The chunks that came for ``owner``'s sessions (waiting up to ``wait`` s for
        the first), copied out: they travel through the object store. Other
        callers' chunks stay held for them, in their slots: a caller that does not
        take stalls its own sessions (credits), never grows this actor."""
        out = [self._copy(batch, row) for batch, row in self.waiting.pop(owner, [])]
        batch = self.client.poll_batch(timeout=0 if out else wait)
        while batch is not None:
            for i, session in enumerate(batch.sessions):
                whose = self.owner.get(session, "")
                if whose == owner:
                    out.append(self._copy(batch, i))
                else:
                    self.waiting.setdefault(whose, []).append((batch, i))
            batch = self.client.poll_batch(timeout=0)
        return out

    @staticmethod
    def _copy(batch: Any, row: int) -> tuple[str, int, np.ndarray[Any, Any]]:
        chunk = (batch.sessions[row], int(batch.chunks[row]), np.array(batch.latents[row]))
        batch.release_row(row)
        return chunk

    def notices(self) -> list[tuple[str, str, str]]:
        return [(n.session, n.kind.name, n.message) for n in self.client.notices()]

    def stop(self) -> int:
        """Leave and stop the daemon (it finalizes and unlinks; killed after a grace
        period, and what it left removed); its exit code."""
        self.client.close()
        return self.daemon.stop()


class Router:
    """Sessions to hosts: admission by free rows, sticky, losses reported."""

    def __init__(self, hosts: list[Any]) -> None:
        self.hosts = hosts
        self.live = set(range(len(hosts)))
        self.placement: Placement[int] = Placement()  # session -> host, with its owner
        self.lost_by: dict[str, list[str]] = {}  # owner -> sessions lost
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
            if choices:
                self.placement.settle(session, choices[0], owner)
                return choices[0]
        raise AdmissionError(f"session {session!r}: every daemon of the cluster is full")

    def release(self, session: str) -> None:
        with self.lock:
            self.placement.release(session)

    def lost(self, owner: str) -> list[str]:
        """The sessions of ``owner`` whose host died since it last asked."""
        with self.lock:
            return self.lost_by.pop(owner, [])

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
            self.live.discard(index)
            for session, owner in self.placement.lose(index):
                self.lost_by.setdefault(owner, []).append(session)
