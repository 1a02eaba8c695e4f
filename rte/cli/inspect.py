"""``rte inspect``: read live daemons' rings, slab and counters, and print them.

    rte inspect                  every daemon of this user: alive or dead, load
    rte inspect NAME             manifest, clients and their rings, slab, counters
    rte inspect NAME --watch     the same, refreshed in place, with rates
    rte inspect NAME --json      for scripts (so does the listing: rte inspect --json)
    rte inspect NAME --ring 0    the records waiting in client 0's rings, decoded
    rte inspect NAME --remove    unlink what a dead daemon left in /dev/shm
    rte inspect NAME --prometheus  its counters, gauges and histograms for a scraper

What is read, and how without disturbing the daemon, is :mod:`rte.ipc.inspect`;
this module only renders it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from typing import Any

from rte.cli import clean
from rte.client import replicas_of
from rte.client.daemon import running_ones
from rte.errors import EngineGone, RteError
from rte.ipc.inspect import (
    daemons,
    delivery_us,
    ring_records,
    snapshot,
    summary,
    waking,
)
from rte.ipc.metrics import prometheus

# A live daemon beats every turn: at least every 50 ms when idle, once a tick when
# paced. Older than this (plus two of its periods) it is stopped (SIGSTOP) or hung.
STALE_BEAT_S = 1.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="read daemons' rings, slab and counters from shared memory",
        description="Read daemons' rings, slab and counters from shared memory, "
        "asking the daemons nothing.",
    )
    p.add_argument("name", nargs="?", help="a daemon's name (default: list them all)")
    p.add_argument("--json", action="store_true", help="JSON instead of text")
    p.add_argument(
        "--prometheus", action="store_true", help="the Prometheus text format (for a scraper)"
    )
    p.add_argument("--watch", action="store_true", help="refresh in place, with rates")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    p.add_argument("--ring", type=int, metavar="CLIENT", help="dump a client's waiting records")
    p.add_argument("--remove", action="store_true", help="remove a dead daemon's leftovers")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.name is None:
            rows = [summary(n) for n in daemons()]
            print(json.dumps(rows, indent=2) if args.json else render_list(rows))
            return 0
        if args.remove:
            return clean.run(args)  # rte clean NAME
        if args.name not in daemons():
            members = replicas_of(args.name)
            if not members:
                raise EngineGone(f"no daemon named {args.name}{running_ones()}")
            return _pool(args, members)
        if args.ring is not None:
            return _rings(args)
        if args.prometheus:
            print(prometheus(snapshot(args.name)), end="")
            return 0
        return _show(args)
    except KeyboardInterrupt:  # the end of --watch (errors are the command line's: one line)
        return 0


def _pool(args: argparse.Namespace, members: list[str]) -> int:
    """A pool's name (``rte serve --name NAME --replicas N``): its members, listed."""
    if args.ring is not None or args.prometheus:
        raise RteError(
            f"{args.name} is a pool of {len(members)} daemons ({', '.join(members)}): "
            "name one of them"
        )
    while True:
        rows = [summary(n) for n in members]
        if args.json:
            print(json.dumps(rows) if args.watch else json.dumps(rows, indent=2), flush=True)
        else:
            head = f"pool {args.name}: {len(members)} daemons (rte inspect NAME-i for one)"
            text = f"{head}\n{render_list(rows)}"
            clear = "\x1b[H\x1b[2J" if args.watch else ""
            print(clear + (fit(text, shutil.get_terminal_size().columns) if clear else text))
        if not args.watch:
            return 0
        time.sleep(args.interval)


def stale_beat(row: dict[str, Any]) -> float | None:
    """The heartbeat's age when a live daemon's beat is older than it should be."""
    age, pace = row.get("heartbeat_age_s"), row.get("pace_hz") or 0.0
    if not row.get("alive") or age is None:
        return None
    return age if age > STALE_BEAT_S + (2 / pace if pace else 0.0) else None


def status(row: dict[str, Any]) -> str:
    """``alive``, ``draining`` (``rte drain``: it takes no new session), ``DEAD``,
    or ``alive, heartbeat stale 2.6 s: stopped or hung?``."""
    if not row.get("alive"):
        return "DEAD"
    stale = stale_beat(row)
    alive = "alive" if row.get("draining_s") is None else "draining"
    return alive if stale is None else f"{alive}, heartbeat stale {stale:.1f} s: stopped or hung?"


def pace(row: dict[str, Any]) -> str:
    hz = row.get("pace_hz")
    return "-" if hz is None else f"{hz:g} Hz" if hz else "unpaced"


def _rings(args: argparse.Namespace) -> int:
    records = ring_records(args.name, args.ring)
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    for label, items in records.items():
        print(f"{label} of client {args.ring}: {len(items)} waiting")
        for item in items:
            print(f"  {item}")
    return 0


def _show(args: argparse.Namespace) -> int:
    previous = None
    while True:
        snap = snapshot(args.name)
        if args.json:  # watched: one object per line, for a pipe
            print(json.dumps(snap) if args.watch else json.dumps(snap, indent=2), flush=True)
        elif args.watch:
            width = shutil.get_terminal_size().columns
            print("\x1b[H\x1b[2J" + fit(render(snap, previous), width), flush=True)
        else:
            print(render(snap, previous))
        if not args.watch:
            return 0
        previous = snap
        time.sleep(args.interval)


def fit(text: str, width: int) -> str:
    """Every line cut to ``width`` columns (an ellipsis says where), so a refresh in
    place never wraps and scrolls."""
    width = max(width, 20)
    return "\n".join(
        line if len(line) <= width else line[: width - 1] + "…" for line in text.splitlines()
    )


def _draining(row: dict[str, Any]) -> str:
    """`` for 3.2s, 2 sessions left`` while it drains (rte drain), else "": the
    sessions it holds, as rte drain counts them (out on a move too)."""
    if row.get("draining_s") is None:
        return ""
    left = row.get("held", row.get("sessions"))
    return f" for {_age(row['draining_s'])} (no new session), {left} left"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def _us(value: float) -> str:
    return f"<={value:,.0f} µs" if value >= 10 else f"<={value:.1f} µs"


def render_list(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no rte daemons of this user (start one: rte serve --name NAME)"
    lines = [
        f"{'NAME':<24}{'PID':>8}  {'STATUS':<8}{'UPTIME':>8}{'BEAT':>8}  "
        f"{'MODEL':<12}{'PACE':>9}{'SESSIONS':>10}{'CLIENTS':>8}"
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['name']:<24}  unreadable: {r['error']}")
            continue
        stale = stale_beat(r) is not None
        lines.append(
            f"{r['name']:<24}{r['pid']:>8}  {'STALE' if stale else status(r):<8}"
            f"{_age(r['uptime_s']):>8}{_age(r['heartbeat_age_s']):>8}  {r['model']:<12}"
            f"{pace(r):>9}{r['sessions']:>5}/{r['max_sessions']:<4}{r['clients']:>8}"
        )
        if stale:
            lines.append(f"  {status(r)}")
        if r["remove"]:
            lines.append(f"  stale leftovers; remove with: {r['remove']}")
    return "\n".join(lines)


def _slab_lines(label: str, slab: dict[str, Any]) -> list[str]:
    """A slab's state (the chunks' slab, or the input slab), its counters and holders."""
    st, states, pad = slab["statistics"], slab["by_state"], " " * len(label)
    lines = [
        f"{label}  {st['slots']} slots of {st['slot_size']:,} B  free {states['free']}  "
        f"writing {states['writing']}  ready {states['ready']}  "
        f"quota {st['quota']}/client  oldest held {_age(slab['oldest_held_s'])}",
        f"{pad}  acquired {st['acquired']}  released {st['released']}  "
        f"reclaimed {st['reclaimed']}  "
        f"stale refused {st['stale_refused']}  quota refused {st['quota_refused']}  "
        f"full {st['full_events']}  high water {st['high_water']}",
    ]
    if "segments" in slab:  # the input slots: one segment per client slot
        lines[0] += f"  (a segment per client: {slab['segments']})"
    held = slab["held_by_client"]
    lines.append(f"{pad}  {'HOLDER':<10}{'SLOTS':>6}" if held else f"{pad}  no slot held")
    lines += [f"{pad}  client {k:<3}{v:>6}" for k, v in held.items()]
    return lines


def capacity_line(rt: dict[str, Any]) -> str:
    """ "capacity ≈ N sessions at 30 Hz, M attached" (and what is reduced, late, missed)."""
    if not rt.get("pace_hz"):
        return f"capacity: unpaced (admission by rows), {rt.get('attached', 0)} attached"
    hz = f"{rt['pace_hz']:g} Hz"
    known = rt["capacity"] is not None
    head = (
        f"capacity ≈ {rt['capacity']} sessions at {hz}"
        if known
        else f"capacity at {hz}: not known yet"
    )
    cost = f"  turn ≈ {rt['cost_a_s'] * 1e3:.2f} ms + {rt['cost_b_s'] * 1e3:.3f} ms/session"
    return (
        f"{head}, {rt['attached']} attached, {rt['reduced']} reduced  "
        f"admission {rt['admission']} (margin {rt['margin']:.0%})"
        + (cost if known else "")
        + f"  ticks late {rt['ticks_late']} missed {rt['ticks_missed']}"
    )


def waking_line(figures: dict[str, Any]) -> str:
    """ "waking (per step): daemon 0.01 sleeps, 0.01 wake-ups ...; clients 0.02 wake-ups"."""

    def per(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    d = figures["daemon"]
    return (
        f"waking (per step, {figures['steps']} steps): daemon {per(d['sleeps_per_step'])} "
        f"sleeps, {per(d['wakeups_per_step'])} wake-ups ({d['waits']} waits, "
        f"{d['sleeps']} sleeps, {d['wakeups']} wake-ups); clients "
        f"{per(figures['client_wakeups_per_step'])} wake-ups (WAKES: posts that woke a "
        "ring's reader, ~145 µs each here)"
    )


SESSION_ROWS = 20  # per client; the rest are counted (all of them are in --json)
_SESSION_COLUMNS = [  # (heading, figure, format)
    ("CHUNKS", "chunks", "{:d}"),
    ("TTFC", "ttfc_ms", "{:.1f}ms"),
    ("ON TIME", "on_time_pct", "{:.1f}%"),
    ("GAP p50", "gap_p50_ms", "{:.1f}ms"),
    ("p99", "gap_p99_ms", "{:.1f}ms"),
    ("STALL", "longest_stall_ms", "{:.0f}ms"),
    ("PHOTON p50", "photon_p50_ms", "{:.1f}ms"),
    ("p95", "photon_p95_ms", "{:.1f}ms"),
    ("REDUCED", "reductions", "{:d}"),
    ("PARKED", "parked_bytes", "{:,d}B"),
]


def _session_lines(clients: list[dict[str, Any]]) -> list[str]:
    """Each live session's real-time figures (see ``rte.ipc.figures``), per client."""
    live = [(c["index"], s) for c in clients for s in c.get("session_figures", []) if s["live"]]
    if not live:
        return []
    head = f"{'CLIENT':<7}{'SESSION':<18}" + "".join(f"{h:>11}" for h, _, _ in _SESSION_COLUMNS)
    lines = ["", head]
    shown: dict[int, int] = {}
    for index, s in live:
        shown[index] = shown.get(index, 0) + 1
        if shown[index] > SESSION_ROWS:
            continue
        cells = "".join(
            f"{'-' if s[key] is None else fmt.format(s[key]):>11}"
            for _, key, fmt in _SESSION_COLUMNS
        )
        name = s["session"] if len(s["session"]) <= 17 else s["session"][:16] + "…"
        lines.append(f"{index:<7}{name:<18}{cells}")
    for index, n in shown.items():
        if n > SESSION_ROWS:
            lines.append(f"{index:<7}... and {n - SESSION_ROWS} more sessions (rte inspect --json)")
    return lines


def render(snap: dict[str, Any], previous: dict[str, Any] | None = None) -> str:
    s, m = snap["summary"], snap["manifest"]
    dt = snap["taken_at"] - previous["taken_at"] if previous else 0.0
    before = {c["index"]: c for c in previous["clients"]} if previous else {}
    lines = [
        f"daemon {snap['name']}  pid {s.get('pid')}  {status(s)}{_draining(s)}  "
        f"state {s.get('state') if s.get('alive') else 'DEAD'}  uptime {_age(s.get('uptime_s'))}  "
        f"heartbeat {_age(s.get('heartbeat_age_s'))} ago",
        f"model {m['model']}  pace {pace(s)}  "
        f"sessions {s.get('sessions')}/{m['max_sessions']}  chunk "
        f"{m['latent_dtype']}{list(m['latent_shape'])}  "
        f"pipeline depth {m['pipeline_depth_chunks']}  "
        f"input latency {m['input_latency_chunks']} chunk(s)",
        capacity_line(snap.get("realtime") or {}),
        "",
        f"{'CLIENT':<7}{'PID':>8} {'ALIVE':<6}{'SESS':>5}  "
        f"{'RING':<7}{'CAP':>8}{'USED':>8}{'HIGH':>8}"
        f"{'FULL':>6}{'RECORDS':>10}{'BYTES':>12}{'REC/S':>9}{'WAKES':>8}",
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
                f"{r['wakeups']:>8}"
            )
        old_client = before.get(c["index"])
        taken = delivery_us(
            c["pushed_to_taken"], old_client["pushed_to_taken"] if old_client else None
        )
        if taken:
            lines.append(f"{'':26}  pushed to taken: p50 {_us(taken[0])}  p99 {_us(taken[1])}")
    if not snap["clients"]:
        lines.append("(no clients)")
    lines += _session_lines(snap["clients"])
    for label, slab in (("slab", snap["slab"]), ("inputs", snap.get("inputs"))):
        if slab is not None:
            lines += ["", *_slab_lines(label, slab)]
    pushed = delivery_us(
        snap["emitted_to_pushed"], previous["emitted_to_pushed"] if previous else None
    )
    if pushed:
        recent = " (since the last refresh)" if previous else ""
        lines += [
            "",
            f"delivery{recent}  emitted to pushed (daemon): p50 {_us(pushed[0])}  "
            f"p99 {_us(pushed[1])}; pushed to taken (client): per client above",
        ]
    lines += ["", waking_line(waking(snap, previous))]
    counters = dict(snap["counters"])
    first, last = counters.pop("first_error_ns"), counters.pop("last_error_ns")
    lines += ["", "counters  " + "  ".join(f"{k} {v}" for k, v in counters.items())]
    if first:
        lines.append(
            f"          errors: first {time.strftime('%H:%M:%S', time.localtime(first / 1e9))}, "
            f"last {time.strftime('%H:%M:%S', time.localtime(last / 1e9))}"
        )
    return "\n".join(lines)
