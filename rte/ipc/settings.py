"""What a daemon is started with (``rte serve``'s options), checked at once.

A setting that cannot hold is refused before anything is created, with one
line that says which, why and what to use instead: a daemon never starts into a
state where one client can stall another (slots over-committed), where one
client cannot drive all its sessions at their credits (a quota that holds fewer
chunks than they may run ahead: they would be throttled, silently), where a
ring cannot carry a step's answer, or past what the control segment's layout
can describe (:data:`~rte.protocol.control.MAX_SESSIONS` rows, the slab's 2**32
slots). What only the model knows, the size of its chunk, is checked once it is
loaded and before anything is created: :meth:`Settings.check_memory` refuses
settings whose segments ``/dev/shm`` has no room for.

The sizes left out follow from the others, so the defaults never throttle:

- each client's **session handles** (``--sessions-per-client``) are the rows:
  one client may hold as many sessions as the daemon has rows. More let one
  client (a gateway serving many users) hold parked sessions past the rows;
  each costs its credit words in every mailbox and its figures (a few KiB);
- each client's **quota** is what one client driving every session it may hold
  needs: every session's credits, plus one chunk per row in flight (a detached
  session's last chunk, a pipelined engine's next one): ``rows x (credits + 1)``
  by default, ``handles x credits + rows`` with more handles than rows (a parked
  session's unreleased chunks still hold their slots);
- the **slab** holds every client's quota (quotas never over-commit it, so a
  client that holds all its slots stalls only itself);
- a **ring** carries the STEP record of every row a client may have stepped at
  once (at least 256 KiB).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rte.credits import chunks_to_drive
from rte.errors import ConfigurationError
from rte.ipc import footprint
from rte.ipc.sources import setting
from rte.models import model_choices
from rte.parking import DEFAULT_PARK_BYTES
from rte.protocol.control import MAX_CLIENTS, MAX_SESSIONS
from rte.protocol.names import DaemonNames
from rte.protocol.requests import DEFAULT_CREDITS
from rte.protocol.wire import MAX_CREDITS, STEP_AT, STEP_ROW_BYTES
from shm import WaitPolicy
from shm.ring import max_record

MIN_RING_KIB = 4
DEFAULT_RING_KIB = 256
MAX_SLOTS = 1 << 32  # a slab's slot count (shm_slab_check refuses more)
PACE_HZ = (1e-3, 1e6)  # a period the tick word's nanoseconds can hold; at most a microsecond
ADMISSIONS = ("realtime", "rows")


@dataclass(frozen=True)
class Settings:
    """A daemon's settings; ConfigurationError, naming the option, for one that cannot hold.

    Each field says what it is in its :func:`~rte.ipc.sources.setting` help, the
    one text ``rte serve --help`` prints; ``RTE_*`` and TOML read the same
    fields (:mod:`rte.ipc.sources`). What the sizes left out follow from is
    the module's docstring: quotas never over-commit the slab (quota x
    max_clients <= slab_slots), so a client that holds all its slots stalls
    only itself, nor hold fewer chunks than every row's credits, so one client
    can drive every session at full rate.
    """

    name: str = setting(help="the daemon's name (clients connect by it)")
    model: str = setting("reference", f"short name or module:factory; {model_choices()}")
    model_settings: Mapping[str, Any] | None = setting(
        None,
        "a keyword argument of the model's factory (repeatable; numbers and true/false "
        "are typed), e.g. --model-setting cost=2 for the world model",
        flag="model-setting",
    )
    device: str | None = setting(
        None,
        "where the model computes: cpu, cuda or cuda:N (one daemon per GPU; "
        "default: the model's own choice)",
    )
    max_sessions: int = setting(8, "rows of the engine's arena")
    engines: int = setting(
        1,
        "engines of the model in this daemon, each of --max-sessions rows, sessions "
        "routed over them (for models that cannot batch)",
    )
    max_clients: int = setting(8, "client processes at once")
    sessions_per_client: int | None = setting(
        None,
        "sessions one client may hold at once, parked ones included (default: the "
        "rows, --max-sessions x --engines); more let one client, a gateway such as "
        "rte play, hold parked sessions past the rows (with --park-idle-s or its "
        "suspends), at the cost of a larger quota and slab",
    )
    ring_kib: int | None = setting(
        None, "each client ring's size (default: a step of every row, at least 256)"
    )
    slab_slots: int | None = setting(
        None,
        "chunks in flight in all (default: every client's quota, so that each may "
        "drive every session at full rate)",
    )
    quota: int = setting(
        0,
        "slots one client may hold (0: every row's credits plus one in flight, or an "
        "even share of --slab-slots)",
    )
    credits: int = setting(
        DEFAULT_CREDITS,
        "chunks a session may have emitted and not released before it waits for its "
        "client (a client may ask for others per attach)",
    )
    pace_hz: float = setting(0.0, "steps per second (0: flat out)")
    admission: str = setting(
        "realtime",
        "realtime: a paced daemon refuses an attach past the sessions its pace holds "
        "(measured); rows: only --max-sessions limits admission",
        choices=ADMISSIONS,
    )
    realtime_margin: float = setting(0.1, "share of the period kept free at admission")
    wait_policy: str = setting(
        "spin-then-block",
        "how an idle daemon waits",
        choices=tuple(policy.value for policy in WaitPolicy),
    )
    idle_limit_s: float = setting(30.0, "detach the sessions of a stalled client")
    metrics_port: int | None = setting(
        None, "serve Prometheus metrics at http://127.0.0.1:PORT/metrics (0: any free port)"
    )
    input_slots: int | None = setting(
        None,
        "slots through which clients lend large inputs by reference (default "
        "max-sessions + 2 per client, at least 4; 0: none)",
    )
    input_slot_kib: int = setting(1024, "the largest input one input slot carries")
    park_bytes: int = setting(
        DEFAULT_PARK_BYTES,
        "host memory for suspended sessions' states, in bytes (a suspend past it is "
        "refused; 0: none suspended)",
    )
    park_idle_s: float = setting(
        0.0,
        "park a session that consumed nothing for this long, resumed on its next action "
        "or release (0: off)",
    )
    checkpoint_every: int = setting(
        0,
        "write each session's state into the checkpoint segment every K of its chunks, "
        "which outlives a crash (0: off)",
    )

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
        _at_least("engines", self.engines, 1)
        if self.rows > MAX_SESSIONS:
            given = f"--max-sessions {self.max_sessions}" + (
                f" x --engines {self.engines} = {self.rows} rows" if self.engines > 1 else ""
            )
            raise ConfigurationError(f"{given}: at most {MAX_SESSIONS} rows in one daemon")
        _at_least("max-clients", self.max_clients, 1)
        self._check_handles()
        if self.max_clients > MAX_CLIENTS:
            raise ConfigurationError(f"--max-clients {self.max_clients}: at most {MAX_CLIENTS}")
        if not 1 <= self.credits <= MAX_CREDITS:
            raise ConfigurationError(f"--credits {self.credits}: must be 1 to {MAX_CREDITS}")
        self._check_slots()
        self._check_ring()
        if not (self.pace_hz == 0 or PACE_HZ[0] <= self.pace_hz <= PACE_HZ[1]):
            raise ConfigurationError(
                f"--pace-hz {self.pace_hz}: must be 0 (flat out) or "
                f"{PACE_HZ[0]:g} to {PACE_HZ[1]:g} steps a second"
            )
        if not self.idle_limit_s > 0:
            raise ConfigurationError(f"--idle-limit-s {self.idle_limit_s}: must be more than 0")
        if self.admission not in ADMISSIONS:
            raise ConfigurationError(
                f"--admission {self.admission!r}: one of {', '.join(ADMISSIONS)}"
            )
        if not 0 <= self.realtime_margin < 1:
            raise ConfigurationError(
                f"--realtime-margin {self.realtime_margin}: a share of the period, 0 to below 1"
            )
        if self.device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigurationError(f"--device {self.device!r}: one of cpu, cuda, cuda:N")
        if self.input_slots is not None and self.input_slots:
            _at_least("input-slots", self.input_slots, self.max_clients, "one per client, or 0")
        _at_least("input-slots", self.input_slots or 0, 0)
        _at_most("input-slots", self.input_slab_slots, MAX_SLOTS)
        _at_least("input-slot-kib", self.input_slot_kib, 1)
        _at_least("park-bytes", self.park_bytes, 0)
        _at_least("checkpoint-every", self.checkpoint_every, 0)
        if not self.park_idle_s >= 0:
            raise ConfigurationError(f"--park-idle-s {self.park_idle_s}: 0 (off) or more")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigurationError(f"--metrics-port {self.metrics_port}: 0 to 65535")
        try:
            WaitPolicy(self.wait_policy)
        except ValueError:
            known = ", ".join(p.value for p in WaitPolicy)
            raise ConfigurationError(
                f"--wait-policy {self.wait_policy!r}: one of {known}"
            ) from None

    def _check_handles(self) -> None:
        """Session handles: 1 to what the layout describes; past the rows only
        where sessions can be parked (else a client never holds more)."""
        if self.sessions_per_client is None:
            return
        _at_least("sessions-per-client", self.sessions_per_client, 1)
        _at_most("sessions-per-client", self.sessions_per_client, MAX_SESSIONS)
        if self.sessions_per_client > self.rows and self.park_bytes <= 0:
            raise ConfigurationError(
                f"--sessions-per-client {self.sessions_per_client} is more than the "
                f"{self.rows} rows, but --park-bytes {self.park_bytes} parks no session, so "
                "a client never holds more sessions than rows; give --park-bytes a budget, "
                "or leave --sessions-per-client out (the rows)"
            )

    def _check_slots(self) -> None:
        """The slab and the quotas: no client starves another, none is throttled."""
        if self.slab_slots is not None:
            _at_least("slab-slots", self.slab_slots, self.max_clients, "one per client")
        _at_least("quota", self.quota, 0)
        n, slots, quota = self.max_clients, self.slab_slot_count, self.client_quota
        if quota * n > slots:
            raise ConfigurationError(
                f"--quota {quota} x --max-clients {n} is more than --slab-slots {slots}: "
                f"clients could starve each other; use --slab-slots {quota * n} "
                "or fewer --max-clients"
            )
        credits = self.handles * self.credits
        if quota < credits:
            need = self._chunks_to_drive
            given = [f"--quota {quota}"] if self.quota else []
            if self.slab_slots is not None:
                given.append(f"--slab-slots {slots} for --max-clients {n}")
            fix = [f"--quota {need}"] if self.quota else []
            if self.slab_slots is not None:
                fix.append(f"--slab-slots {need * n}")
            raise ConfigurationError(
                f"{' and '.join(given)} leaves one client {quota} slots, fewer than the "
                f"{credits} chunks its sessions' credits hold ({self._held_by} x --credits "
                f"{self.credits}): they would be throttled; use {' '.join(fix)} (or leave "
                "it out: derived)"
            )
        _at_most("slab-slots", slots, MAX_SLOTS)

    def _check_ring(self) -> None:
        """A client's ring carries a STEP record of every row it may have stepped at once."""
        if self.ring_kib is None:
            return
        _at_least("ring-kib", self.ring_kib, MIN_RING_KIB)
        rows = self.step_rows
        carried = (max_record(self.ring_capacity) - STEP_AT) // STEP_ROW_BYTES
        if carried < rows:
            raise ConfigurationError(
                f"--ring-kib {self.ring_kib}: a ring that size carries a step of {carried} "
                f"chunks, fewer than the {rows} one client may have in one step; use "
                f"--ring-kib {_ring_bytes(rows) // 1024} (or leave it out: derived)"
            )

    @property
    def _engines(self) -> str:
        return f" x --engines {self.engines}" if self.engines > 1 else ""

    @property
    def _held_by(self) -> str:
        """What bounds one client's sessions, as the options say it."""
        if self.sessions_per_client is not None:
            return f"--sessions-per-client {self.sessions_per_client}"
        return f"--max-sessions {self.max_sessions}{self._engines}"

    @property
    def names(self) -> DaemonNames:
        return DaemonNames(self.name)

    @property
    def rows(self) -> int:
        """Sessions the daemon serves at once: every engine's rows."""
        return self.max_sessions * self.engines

    @property
    def handles(self) -> int:
        """Session handles of each client (its mailbox's): the sessions one client may
        hold at once, parked ones included (``sessions_per_client``, or the rows)."""
        return self.rows if self.sessions_per_client is None else self.sessions_per_client

    @property
    def _chunks_to_drive(self) -> int:
        """Chunks one client holds at most: each of its sessions' credits, plus one
        in flight per row its sessions may hold (``rows x (credits + 1)`` by default)."""
        in_rows = min(self.handles, self.rows)
        return chunks_to_drive(in_rows, self.credits) + (self.handles - in_rows) * self.credits

    @property
    def client_quota(self) -> int:
        """Slab slots one client may hold (see ``quota``)."""
        if self.quota:
            return self.quota
        if self.slab_slots is not None:
            return self.slab_slots // self.max_clients
        return self._chunks_to_drive

    @property
    def slab_slot_count(self) -> int:
        """Slots of the slab: ``slab_slots``, or every client's quota."""
        if self.slab_slots is not None:
            return self.slab_slots
        return self.max_clients * self.client_quota

    @property
    def step_rows(self) -> int:
        """The most chunks one client receives from one step (one STEP record)."""
        return min(self.rows, self.handles, self.client_quota)

    @property
    def ring_capacity(self) -> int:
        """Each ring's byte capacity: ``ring_kib`` (or what a step of every row
        needs, at least 256 KiB) rounded up to a power of two."""
        if self.ring_kib is None:
            size = max(DEFAULT_RING_KIB * 1024, _ring_bytes(self.step_rows))
        else:
            size = self.ring_kib * 1024
        return 1 << (size - 1).bit_length()

    @property
    def input_slab_slots(self) -> int:
        """Slots of the input slab (0: the daemon takes no inputs by slot)."""
        if self.input_slots is None:
            return max(4, self.max_sessions + 2) * self.max_clients
        return self.input_slots

    def segment_bytes(self, chunk_bytes: int) -> dict[str, int]:
        """The bytes of each shared segment, for chunks of ``chunk_bytes``
        (:func:`rte.ipc.footprint.segment_bytes`)."""
        return footprint.segment_bytes(self, chunk_bytes)

    def check_memory(self, chunk_bytes: int, free: int | None = None) -> None:
        """ConfigurationError when ``/dev/shm`` cannot hold the segments
        (:func:`rte.ipc.footprint.check_memory`)."""
        footprint.check_memory(self, chunk_bytes, free)


def _ring_bytes(rows: int) -> int:
    """The smallest ring capacity whose largest record is a STEP of ``rows`` chunks."""
    largest, capacity = STEP_AT + rows * STEP_ROW_BYTES, 64
    while max_record(capacity) < largest:
        capacity *= 2
    return capacity


def _at_least(option: str, value: int, low: int, why: str = "") -> None:
    if value < low:
        raise ConfigurationError(
            f"--{option} {value}: must be at least {low}{f' ({why})' if why else ''}"
        )


def _at_most(option: str, value: int, high: int) -> None:
    if value > high:
        raise ConfigurationError(f"--{option} {value}: at most {high:,}")
