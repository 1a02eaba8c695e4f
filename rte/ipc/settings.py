"""What a daemon is started with (``rte serve``'s options), checked at once.

A setting that cannot hold is refused before anything is created, with one
line that says which and why: a daemon never starts into a state where one
client can stall another (slots over-committed) or where a ring cannot carry
an answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rte.errors import ConfigurationError
from rte.ipc.control import MAX_CLIENTS
from rte.ipc.names import DaemonNames
from rte.ipc.wire import MAX_CREDITS
from rte.serve import DEFAULT_CREDITS
from shm import WaitPolicy

MIN_RING_KIB = 4


@dataclass(frozen=True)
class Settings:
    """A daemon's settings; ConfigurationError, naming the option, for one that cannot hold.

    Attributes:
        name: the daemon's name; clients connect by it.
        model: a short model name or ``module:factory``.
        max_sessions: rows of the engine's arena.
        max_clients: client slots (each has a ring pair and a slab quota).
        ring_kib: the size of each client ring (rounded up to a power of two).
        slab_slots: slots of the shared slab (each holds one chunk).
        quota: slots one client may hold at once; 0: an even share. Quotas may
            not over-commit the slab (quota x max_clients <= slab_slots), so a
            client that holds all its slots stalls only itself.
        credits: each session's default credits: how many of its chunks may be
            emitted and not yet released before it waits for its client (a
            client may ask for other credits per attach).
        pace_hz: target steps per second; 0 steps as fast as possible.
        wait_policy: how an idle daemon waits for requests.
        idle_limit_s: a client that consumes nothing this long while its
            sessions wait has them detached, and is told why.
        model_settings: extra keyword arguments for the model's factory.
        device: where the model computes, ``cpu``, ``cuda`` or ``cuda:N`` (one
            daemon per GPU); None leaves it to the model. Given, it is passed to
            the model's factory as ``device``.
        metrics_port: serve Prometheus metrics at http://127.0.0.1:PORT/metrics
            (0: any free port, said in the ready line); None: not served.
        input_slots: slots of the input slab, through which clients lend large
            inputs (frames, images) by reference; None: ``max_sessions + 2``
            (at least 4) per client, so that every session may hold a frame
            and replace it; 0: none. Each client may hold an even share.
        input_slot_kib: each input slot's size (the largest input one carries).
        engines: engines this daemon serves, each of ``max_sessions`` rows, sessions
            routed over them (a ReplicaEngine): for models that cannot batch.
    """

    name: str
    model: str = "reference"
    max_sessions: int = 8
    max_clients: int = 8
    ring_kib: int = 256
    slab_slots: int = 64
    quota: int = 0
    credits: int = DEFAULT_CREDITS
    pace_hz: float = 0.0
    wait_policy: str = "spin-then-block"
    idle_limit_s: float = 30.0
    model_settings: Mapping[str, Any] | None = None
    device: str | None = None
    metrics_port: int | None = None
    input_slots: int | None = None
    input_slot_kib: int = 1024
    engines: int = 1

    def __post_init__(self) -> None:
        try:
            self._check()
        except ConfigurationError:
            raise
        except ValueError as exc:  # a name that cannot be one
            raise ConfigurationError(str(exc)) from None

    def _check(self) -> None:
        DaemonNames(self.name)
        _at_least("max-sessions", self.max_sessions, 1)
        _at_least("max-clients", self.max_clients, 1)
        if self.max_clients > MAX_CLIENTS:
            raise ConfigurationError(f"--max-clients {self.max_clients}: at most {MAX_CLIENTS}")
        _at_least("ring-kib", self.ring_kib, MIN_RING_KIB)
        _at_least("slab-slots", self.slab_slots, self.max_clients, "one per client")
        _at_least("quota", self.quota, 0)
        if self.quota * self.max_clients > self.slab_slots:
            raise ConfigurationError(
                f"--quota {self.quota} x --max-clients {self.max_clients} is more than "
                f"--slab-slots {self.slab_slots}: clients could starve each other; "
                f"use --quota {self.slab_slots // self.max_clients} or more slots"
            )
        if not 1 <= self.credits <= MAX_CREDITS:
            raise ConfigurationError(f"--credits {self.credits}: must be 1 to {MAX_CREDITS}")
        if not self.pace_hz >= 0:
            raise ConfigurationError(f"--pace-hz {self.pace_hz}: must be 0 (flat out) or more")
        if not self.idle_limit_s > 0:
            raise ConfigurationError(f"--idle-limit-s {self.idle_limit_s}: must be more than 0")
        if self.device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigurationError(f"--device {self.device!r}: one of cpu, cuda, cuda:N")
        if self.input_slots is not None and self.input_slots:
            _at_least("input-slots", self.input_slots, self.max_clients, "one per client, or 0")
        _at_least("input-slots", self.input_slots or 0, 0)
        _at_least("input-slot-kib", self.input_slot_kib, 1)
        _at_least("engines", self.engines, 1)
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigurationError(f"--metrics-port {self.metrics_port}: 0 to 65535")
        try:
            WaitPolicy(self.wait_policy)
        except ValueError:
            known = ", ".join(p.value for p in WaitPolicy)
            raise ConfigurationError(
                f"--wait-policy {self.wait_policy!r}: one of {known}"
            ) from None

    @property
    def names(self) -> DaemonNames:
        return DaemonNames(self.name)

    @property
    def ring_capacity(self) -> int:
        """Each ring's byte capacity: ``ring_kib`` rounded up to a power of two."""
        return 1 << (self.ring_kib * 1024 - 1).bit_length()

    @property
    def input_slab_slots(self) -> int:
        """Slots of the input slab (0: the daemon takes no inputs by slot)."""
        if self.input_slots is None:
            return max(4, self.max_sessions + 2) * self.max_clients
        return self.input_slots

    @property
    def client_quota(self) -> int:
        return self.quota or self.slab_slots // self.max_clients


def _at_least(option: str, value: int, low: int, why: str = "") -> None:
    if value < low:
        raise ConfigurationError(
            f"--{option} {value}: must be at least {low}{f' ({why})' if why else ''}"
        )
