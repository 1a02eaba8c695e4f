"""What ``rte inspect`` shows: a daemon read from its shared memory alone.

Modelled on Aeron's AeronStat and iceoryx2's ``iox2``: everything here is read
from the counters the daemon keeps in its segments, through read-only mappings
(the kernel refuses any write), and nothing is ever asked of the daemon. So it
works on a daemon under full load, on a hung one, and on a dead one's
leftovers. The functions return plain dicts (the ``--json`` output);
:mod:`rte.cli.inspect` renders them. Delivery latency comes as histogram
counts (:mod:`rte.protocol.latency`): the daemon's emitted-to-pushed, and each
client's pushed-to-taken; :func:`delivery_us` turns them into percentiles.
How often each side slept and was woken, per step (:func:`waking`), comes from
the daemon's wait counters and the ring headers' ``wakeups`` (a post to a
consumer announced asleep: each cost a wake-up).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import numpy as np

from rte.errors import DaemonRunningError
from rte.ipc import figures
from rte.ipc.figures import SessionFigures
from rte.protocol import latency
from rte.protocol.claims import ClientState
from rte.protocol.control import (
    KIND_CONTROL,
    KIND_FIGURES,
    KIND_INPUTS,
    KIND_MAILBOX,
    KIND_SLAB,
    Control,
    Layout,
)
from rte.protocol.mailbox import Mailbox
from rte.protocol.names import DaemonNames
from rte.protocol.rows import held_rows
from rte.protocol.wire import describe
from shm import Segment, ShmError, Slab, SlotState, is_alive
from shm.lock import NameLockHeld
from shm.segment import HEADER_SIZE


def _open(name: str) -> tuple[Segment, Control]:
    segment = Segment.open(DaemonNames(name).control, kind=KIND_CONTROL, readonly=True)
    return segment, Control(segment)


def daemons() -> list[str]:
    """The name of every daemon of this user that has a control segment."""
    return [names.daemon for names in DaemonNames.present()]


def summary(name: str) -> dict[str, Any]:
    """One line's worth about daemon ``name`` (for the listing); a segment that
    cannot be read gives a row with ``error``, never an exception."""
    try:
        segment, control = _open(name)
    except ShmError as exc:
        return {"name": name, "error": str(exc)}
    try:
        return _summary(name, segment, control)
    except (ShmError, ValueError, TypeError, KeyError) as exc:  # an impostor's garbage
        return {"name": name, "error": str(exc)}
    finally:
        segment.close()


def _summary(name: str, segment: Segment, control: Control) -> dict[str, Any]:
    alive = segment.creator_alive()
    entries = control.table.entries()
    clients = [c for c in entries if c.state is ClientState.ACTIVE]
    manifest = control.manifest()
    draining = control.draining_since_ns
    return {
        "name": name,
        "pid": segment.creator_pid,
        "alive": alive,
        "state": control.state.name.lower(),
        # seconds since it began draining (rte drain; None: it is not draining)
        "draining_s": (time.time_ns() - draining) / 1e9 if draining else None,
        "uptime_s": time.time() - segment.created,
        "heartbeat_age_s": control.heartbeat_age_s,
        "model": manifest.model,
        "pace_hz": control.realtime()["pace_hz"],  # 0: unpaced
        "sessions": held_rows(entries),
        # every session it holds: parked, being detached, out on a drain's move too
        "held": control.held,
        "max_sessions": manifest.max_sessions,
        "clients": len(clients),
        "remove": None if alive else f"rte inspect {name} --remove",
    }


def delivery_us(counts: list[int], before: list[int] | None = None) -> list[float]:
    """p50 and p99 in µs of a delivery histogram (of what was added since
    ``before``, when given: the recent deliveries); [] when there were none."""
    now = np.asarray(counts, np.int64)
    if before is not None:
        now = now - np.asarray(before, np.int64)
    return latency.percentiles_us(now)


def waking(snap: dict[str, Any], before: dict[str, Any] | None = None) -> dict[str, Any]:
    """How each side slept and was woken, per step (of what happened since ``before``,
    another snapshot, when given). ``daemon``: its idle waits, the sleeps among them
    and the wake-ups a client's post gave it; ``clients``: per client slot, the
    posts that woke it (its outbox's ``wakeups``: it slept for a record) and the
    posts it made for requests (its inbox's), with the records it was sent. A
    ``*_per_step`` figure is None before the first step."""
    counters, old = snap["counters"], (before or {}).get("counters", {})
    steps = counters.get("steps", 0) - old.get("steps", 0)
    old_clients = {c["index"]: c for c in (before or {}).get("clients", [])}

    def per(n: int, of: int) -> float | None:
        return n / of if of > 0 else None

    daemon = {
        key: counters.get(counter, 0) - old.get(counter, 0)
        for key, counter in (("waits", "idle_waits"), ("sleeps", "idle_sleeps"))
    }
    daemon["wakeups"] = counters.get("wakeups", 0) - old.get("wakeups", 0)
    clients = []
    for c in snap["clients"]:
        rings, was = c["rings"], old_clients.get(c["index"], {}).get("rings", {})
        if not rings:
            continue
        wakeups, records = (
            _grew(rings, was, "outbox", "wakeups"),
            _grew(rings, was, "outbox", "pushed"),
        )
        clients.append(
            {
                "index": c["index"],
                "wakeups": wakeups,
                "records": records,
                "wakeups_per_record": per(wakeups, records),
                "posts": _grew(rings, was, "inbox", "wakeups"),
            }
        )
    return {
        "steps": steps,
        "daemon": daemon
        | {
            "sleeps_per_step": per(daemon["sleeps"], steps),
            "wakeups_per_step": per(daemon["wakeups"], steps),
        },
        "clients": clients,
        "client_wakeups_per_step": per(sum(c["wakeups"] for c in clients), steps),
    }


def _grew(rings: dict[str, Any], was: dict[str, Any], ring: str, field: str) -> int:
    """How far a ring's counter moved since ``was`` (the rings of an older snapshot)."""
    return int(rings[ring][field] - was.get(ring, {}).get(field, 0))


def remove_leftovers(name: str) -> list[str]:
    """Unlink what a dead daemon ``name`` left; refuses (DaemonRunningError) a live one."""
    try:
        return DaemonNames(name).remove_leftovers()
    except NameLockHeld:
        raise DaemonRunningError(f"daemon {name!r} is alive: stop it instead") from None


def snapshot(name: str) -> dict[str, Any]:
    """Everything about daemon ``name``, read from its segments."""
    segment, control = _open(name)
    names = DaemonNames(name)
    try:
        slab_segment = Segment.open(names.slab, kind=KIND_SLAB, readonly=True)
    except ShmError:
        slab_segment = None
    inputs_segments: dict[int, Segment] = {}  # by client slot (none: --input-slots 0)
    try:
        layout = control.layout
        for i in range(layout.max_clients):
            try:
                inputs_segments[i] = Segment.open(
                    names.client_inputs(i), kind=KIND_INPUTS, readonly=True
                )
            except ShmError:  # none, or not readable: left out
                continue
        board = _figures(names, layout)
        clients = []
        for entry in control.table.entries():
            if entry.state is ClientState.FREE:
                continue
            rings, taken, last_pop = {}, [0] * latency.BUCKETS, 0
            try:
                with _mailbox(names, layout, entry.index) as mailbox:
                    for label, ring in (("inbox", mailbox.inbox), ("outbox", mailbox.outbox)):
                        stats = ring.statistics()
                        rings[label] = asdict(stats) | {"waiting": stats.waiting}
                    taken = mailbox.block.histogram.counts().tolist()
                    last_pop = mailbox.last_pop_ns
            except ShmError:  # gone, or garbled by its client: the row says what it can
                pass
            active = entry.state is ClientState.ACTIVE
            clients.append(
                {
                    "index": entry.index,
                    "pid": entry.pid,
                    "alive": is_alive(entry.pid, entry.start),
                    "state": entry.state.name.lower(),
                    "sessions": entry.sessions,
                    "wakes_by": "fd" if entry.wakes_by_fd else "semaphore",
                    "idle_s": max(0.0, (time.monotonic_ns() - last_pop) / 1e9),
                    "rings": rings,
                    "pushed_to_taken": taken,
                    "session_figures": board(entry.index) if active else [],
                }
            )
        snap = {
            "name": name,
            "summary": summary(name),
            "manifest": asdict(control.manifest()),
            "clients": clients,
            "slab": _slab(slab_segment) if slab_segment is not None else None,
            "inputs": _inputs(inputs_segments) if inputs_segments else None,
            "counters": control.counters(),
            "realtime": control.realtime(),  # capacity at its pace, attached, reduced...
            "emitted_to_pushed": control.histogram.counts().tolist(),
            "emitted_to_pushed_sum_ns": _total(control.histogram),
            "step_ns": control.step_histogram.counts().tolist(),
            "step_sum_ns": _total(control.step_histogram),
            "taken_at": time.time(),
        }
        return snap | {"waking": waking(snap)}
    finally:
        segment.close()
        for opened in (slab_segment, *inputs_segments.values()):
            if opened is not None:
                opened.close()


@contextlib.contextmanager
def _mailbox(names: DaemonNames, layout: Layout, index: int) -> Iterator[Mailbox]:
    """Client slot ``index``'s mailbox, mapped read-only for as long as the block."""
    with Segment.open(names.mailbox(index), kind=KIND_MAILBOX, readonly=True) as segment:
        yield Mailbox.open(segment, layout.ring_capacity, layout.handles)


def _figures(names: DaemonNames, layout: Any) -> Callable[[int], list[dict[str, Any]]]:
    """Each client slot's session figures (:mod:`rte.ipc.figures`), read from the
    daemon's figures segment once per call; [] where there is none."""
    try:
        with Segment.open(names.figures, kind=KIND_FIGURES, readonly=True) as segment:
            size = segment.size - HEADER_SIZE
            data = segment.array(HEADER_SIZE, np.uint8, (size,), readonly=True).tobytes()
    except ShmError:  # none (an older daemon's leftovers), or not readable
        return lambda index: []
    each, handles = figures.size(layout.handles), layout.handles
    now = time.monotonic_ns()

    def of(index: int) -> list[dict[str, Any]]:
        at = index * each
        if at + each > len(data):
            return []
        return SessionFigures(data[at : at + each], handles, 0, readonly=True).sessions(now)

    return of


def _total(histogram: latency.Histogram) -> int:
    return int(histogram.total[0]) if histogram.total is not None else 0


def _slab(segment: Segment) -> dict[str, Any]:
    slab = Slab(segment, HEADER_SIZE)
    by_state = {s.name.lower(): 0 for s in SlotState}
    by_owner: dict[int, int] = {}
    oldest = None
    now = time.monotonic_ns()
    for i in range(slab.slots):
        info = slab.slot(i)
        by_state[info.state.name.lower()] += 1
        if info.state is not SlotState.FREE:
            by_owner[info.owner] = by_owner.get(info.owner, 0) + 1
            age = (now - info.since_ns) / 1e9
            oldest = age if oldest is None else max(oldest, age)
    return {
        "statistics": asdict(slab.statistics()),
        "by_state": by_state,
        "held_by_client": {str(k): v for k, v in sorted(by_owner.items())},
        "oldest_held_s": oldest,
    }


def _inputs(segments: dict[int, Segment]) -> dict[str, Any]:
    """The input segments, one per client slot: their totals as one slab's (the
    statistics summed, quota and slot size per client), each client's under
    ``clients``, and who holds slots (by client slot, not by the owner number
    inside each segment)."""
    each = {i: _slab(segment) for i, segment in sorted(segments.items())}
    first = next(iter(each.values()))
    statistics = {
        key: (
            sum(s["statistics"][key] for s in each.values())
            if key not in ("slot_size", "quota")
            else first["statistics"][key]
        )
        for key in first["statistics"]
    }  # (max_owners: one per segment, so the number of clients)
    ages = [s["oldest_held_s"] for s in each.values() if s["oldest_held_s"] is not None]
    held = {str(i): sum(s["held_by_client"].values()) for i, s in each.items()}
    return {
        "statistics": statistics,
        "by_state": {k: sum(s["by_state"][k] for s in each.values()) for k in first["by_state"]},
        "held_by_client": {i: n for i, n in held.items() if n},
        "oldest_held_s": max(ages) if ages else None,
        "segments": len(each),
        "clients": {str(i): s["statistics"] for i, s in each.items()},
    }


def ring_records(name: str, client: int, limit: int = 50) -> dict[str, list[str]]:
    """The records waiting in client ``client``'s two rings, decoded, not consumed."""
    segment, control = _open(name)
    try:
        if not 0 <= client < control.layout.max_clients:
            raise ValueError(
                f"client {client} does not exist (0..{control.layout.max_clients - 1})"
            )
        entries = control.table.entries()
        if entries[client].state is ClientState.FREE:
            taken = [str(e.index) for e in entries if e.state is not ClientState.FREE]
            raise ValueError(
                f"no client in slot {client} of {name!r}: it is free "
                f"(clients now: {', '.join(taken) or 'none'})"
            )
        out = {}
        with _mailbox(DaemonNames(name), control.layout, client) as mailbox:
            for label, ring in (("inbox", mailbox.inbox), ("outbox", mailbox.outbox)):
                records = []
                for i in range(limit):
                    raw = ring.peek(i)
                    if raw is None:
                        break
                    records.append(describe(raw))
                out[label] = records
        return out
    finally:
        segment.close()
