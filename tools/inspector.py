"""``rte inspect``: read a daemon's rings, slab and counters from shared memory.

Modelled on Aeron's AeronStat and iceoryx2's ``iox2``: everything shown is
read from the counters the daemon keeps in its segments, through read-only
mappings (the kernel refuses any write), and nothing is ever asked of the
daemon. So it works on a daemon under full load, on a hung one, and on a dead
one's leftovers.

    rte inspect                 every daemon of this user: alive or dead, load
    rte inspect NAME            manifest, clients and their rings, slab, counters
    rte inspect NAME --watch    the same, refreshed in place, with rates
    rte inspect NAME --json     for scripts
    rte inspect NAME --ring 0   the records waiting in client 0's rings, decoded
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any

from rte.control import KIND_CONTROL, KIND_SLAB, ClientState, Control, names
from rte.wire import RecordType, WireError, decode
from shm import Ring, Segment, ShmError, Slab, SlotState, is_alive
from shm.segment import HEADER_SIZE, SHM_DIR


def daemons() -> list[str]:
    """Names of every daemon of this user that has a control segment."""
    stem = f"rte.{os.getuid()}."
    return sorted(
        entry.name[len(stem) : -len(".ctl")]
        for entry in SHM_DIR.iterdir()
        if entry.name.startswith(stem) and entry.name.endswith(".ctl")
    )


def _open(name: str) -> tuple[Segment, Control]:
    segment = Segment.open(names(name)["control"], kind=KIND_CONTROL, readonly=True)
    return segment, Control(segment)


def summary(name: str) -> dict[str, Any]:
    """One line's worth about daemon ``name`` (for the listing)."""
    try:
        segment, control = _open(name)
    except ShmError as exc:
        return {"name": name, "error": str(exc)}
    try:
        alive = segment.creator_alive()
        clients = [c for c in control.clients() if c.state is ClientState.ACTIVE]
        manifest = control.manifest()
        return {
            "name": name,
            "pid": segment.creator_pid,
            "alive": alive,
            "state": control.state.name.lower(),
            "uptime_s": time.time() - segment.created,
            "heartbeat_age_s": control.heartbeat_age_s,
            "model": manifest.model,
            "sessions": sum(c.sessions for c in clients),
            "max_sessions": manifest.max_sessions,
            "clients": len(clients),
            "remove": None if alive else _remove_command(name),
        }
    finally:
        segment.close()


def _remove_command(name: str) -> str:
    stem = f"rte.{os.getuid()}.{name}"
    return f"rm -f /dev/shm/{stem}.* /dev/shm/sem.{stem}.*   (or: rte serve --name {name})"


def snapshot(name: str) -> dict[str, Any]:
    """Everything about daemon ``name``, read from its segments."""
    segment, control = _open(name)
    try:
        slab_segment = Segment.open(names(name)["slab"], kind=KIND_SLAB, readonly=True)
    except ShmError:
        slab_segment = None
    try:
        layout = control.layout
        clients = []
        for entry in control.clients():
            if entry.state is ClientState.FREE:
                continue
            rings = {}
            for label, offset in (
                ("inbox", layout.inbox(entry.index)),
                ("outbox", layout.outbox(entry.index)),
            ):
                stats = Ring(segment, offset, policy="spin").statistics()
                rings[label] = asdict(stats) | {"waiting": stats.waiting}
            clients.append(
                {
                    "index": entry.index,
                    "pid": entry.pid,
                    "alive": is_alive(entry.pid, entry.start),
                    "state": entry.state.name.lower(),
                    "sessions": entry.sessions,
                    "idle_s": max(0.0, (time.monotonic_ns() - entry.last_pop_ns) / 1e9),
                    "rings": rings,
                }
            )
        return {
            "name": name,
            "summary": summary(name),
            "manifest": asdict(control.manifest()),
            "clients": clients,
            "slab": _slab(slab_segment) if slab_segment is not None else None,
            "counters": control.counters(),
            "taken_at": time.time(),
        }
    finally:
        segment.close()
        if slab_segment is not None:
            slab_segment.close()


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


def ring_records(name: str, client: int, limit: int = 50) -> dict[str, list[str]]:
    """The records waiting in client ``client``'s two rings, decoded, not consumed."""
    segment, control = _open(name)
    try:
        if not 0 <= client < control.layout.max_clients:
            raise ValueError(
                f"client {client} does not exist (0..{control.layout.max_clients - 1})"
            )
        out = {}
        for label, offset in (
            ("inbox", control.layout.inbox(client)),
            ("outbox", control.layout.outbox(client)),
        ):
            ring = Ring(segment, offset, policy="spin")
            records = []
            for i in range(limit):
                raw = ring.peek(i)
                if raw is None:
                    break
                records.append(_describe(raw))
            out[label] = records
        return out
    finally:
        segment.close()


def _describe(raw: bytes) -> str:
    try:
        record = decode(raw)
    except WireError as exc:
        return f"<undecodable {len(raw)} bytes: {exc}>"
    if record.type is RecordType.CHUNK and record.chunk is not None:
        c = record.chunk
        return (
            f"CHUNK {record.session!r} chunk={c.chunk} slot={c.slot} gen={c.generation} "
            f"{c.dtype}{list(c.shape)}"
        )
    if record.type is RecordType.NOTICE:
        return f"NOTICE {record.session!r} code={record.code} seq={record.seq} {record.value!r}"
    return f"{record.type.name} {record.session!r} seq={record.seq} {record.value!r}"


# -- rendering ------------------------------------------------------------------


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def render_list(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no rte daemons of this user (start one: rte serve --name NAME)"
    lines = [
        f"{'NAME':<24}{'PID':>8}  {'STATUS':<8}{'UPTIME':>8}{'BEAT':>8}  "
        f"{'MODEL':<12}{'SESSIONS':>10}{'CLIENTS':>8}"
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['name']:<24}  unreadable: {r['error']}")
            continue
        status = "alive" if r["alive"] else "DEAD"
        lines.append(
            f"{r['name']:<24}{r['pid']:>8}  {status:<8}{_age(r['uptime_s']):>8}"
            f"{_age(r['heartbeat_age_s']):>8}  {r['model']:<12}"
            f"{r['sessions']:>5}/{r['max_sessions']:<4}{r['clients']:>8}"
        )
        if r["remove"]:
            lines.append(f"  stale leftovers; remove with: {r['remove']}")
    return "\n".join(lines)


def render(snap: dict[str, Any], previous: dict[str, Any] | None = None) -> str:
    s, m = snap["summary"], snap["manifest"]
    dt = snap["taken_at"] - previous["taken_at"] if previous else 0.0
    before = {c["index"]: c for c in previous["clients"]} if previous else {}
    lines = [
        f"daemon {snap['name']}  pid {s.get('pid')}  {'alive' if s.get('alive') else 'DEAD'}  "
        f"state {s.get('state')}  uptime {_age(s.get('uptime_s'))}  "
        f"heartbeat {_age(s.get('heartbeat_age_s'))} ago",
        f"model {m['model']}  sessions {s.get('sessions')}/{m['max_sessions']}  chunk "
        f"{m['latent_dtype']}{list(m['latent_shape'])}  "
        f"pipeline depth {m['pipeline_depth_chunks']}  "
        f"input latency {m['input_latency_chunks']} chunk(s)",
        "",
        f"{'CLIENT':<7}{'PID':>8} {'ALIVE':<6}{'SESS':>5}  "
        f"{'RING':<7}{'CAP':>8}{'USED':>8}{'HIGH':>8}"
        f"{'FULL':>6}{'RECORDS':>10}{'BYTES':>12}{'REC/S':>9}",
    ]
    for c in snap["clients"]:
        for k, (label, r) in enumerate(c["rings"].items()):
            rate = ""
            old = before.get(c["index"])
            if old is not None and dt > 0:
                rate = f"{(r['pushed'] - old['rings'][label]['pushed']) / dt:,.0f}"
            head = (
                f"{c['index']:<7}{c['pid']:>8} "
                f"{('yes' if c['alive'] else 'NO'):<6}{c['sessions']:>5}"
                if k == 0
                else " " * 26
            )
            lines.append(
                f"{head}  {label:<7}{r['capacity']:>8}{r['used_bytes']:>8}"
                f"{r['high_water_bytes']:>8}"
                f"{r['full_events']:>6}{r['pushed']:>10}{r['bytes_pushed']:>12}{rate:>9}"
            )
        if dt > 0 and c["index"] in before and c["sessions"]:
            chunks = (
                c["rings"]["outbox"]["pushed"] - before[c["index"]]["rings"]["outbox"]["pushed"]
            )
            lines.append(f"{'':26}  ~{chunks / dt / c['sessions']:,.1f} chunks/s per session")
    if not snap["clients"]:
        lines.append("(no clients)")
    slab = snap["slab"]
    if slab is not None:
        st = slab["statistics"]
        lines += [
            "",
            f"slab  {st['slots']} slots of {st['slot_size']:,} B  free {slab['by_state']['free']}  "
            f"writing {slab['by_state']['writing']}  ready {slab['by_state']['ready']}  "
            f"quota {st['quota']}/client  held by client {slab['held_by_client'] or '{}'}  "
            f"oldest held {_age(slab['oldest_held_s'])}",
            f"      acquired {st['acquired']}  released {st['released']}  "
            f"reclaimed {st['reclaimed']}  "
            f"stale refused {st['stale_refused']}  quota refused {st['quota_refused']}  "
            f"full {st['full_events']}  high water {st['high_water']}",
        ]
    counters = dict(snap["counters"])
    first, last = counters.pop("first_error_ns"), counters.pop("last_error_ns")
    lines += ["", "counters  " + "  ".join(f"{k} {v}" for k, v in counters.items())]
    if first:
        lines.append(
            f"          errors: first {time.strftime('%H:%M:%S', time.localtime(first / 1e9))}, "
            f"last {time.strftime('%H:%M:%S', time.localtime(last / 1e9))}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rte inspect", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="a daemon's name (default: list them all)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--watch", action="store_true", help="refresh in place, with rates")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument(
        "--ring", type=int, metavar="CLIENT", help="dump a client's waiting records"
    )
    args = parser.parse_args(argv)
    try:
        if args.name is None:
            rows = [summary(n) for n in daemons()]
            print(json.dumps(rows, indent=2) if args.json else render_list(rows))
            return 0
        if args.ring is not None:
            records = ring_records(args.name, args.ring)
            if args.json:
                print(json.dumps(records, indent=2))
            else:
                for label, items in records.items():
                    print(f"{label} of client {args.ring}: {len(items)} waiting")
                    for item in items:
                        print(f"  {item}")
            return 0
        previous = None
        while True:
            snap = snapshot(args.name)
            if args.json:
                print(json.dumps(snap, indent=2))
            else:
                text = render(snap, previous)
                print(("\x1b[H\x1b[2J" if args.watch else "") + text, flush=True)
            if not args.watch:
                return 0
            previous = snap
            time.sleep(args.interval)
    except ShmError as exc:
        print(f"rte inspect: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
