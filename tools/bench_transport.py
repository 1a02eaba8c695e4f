"""Transport benchmark: rte's rings and slab against the peers, in one run.

Three measurements, each against peers measured side by side (ratios are the
claim; absolute times drift with the machine and its load):

1. Round trip of a 64-byte record to another process and back, p50/p99: an
   rte ring pair (``spin`` and ``spin-then-block``) against the floor (a bare
   shared-memory handoff of one word, polled by the same C spin loop the rings
   use), ``multiprocessing.Pipe``, ``multiprocessing.Queue`` and pyzmq
   ``ipc://`` (when installed).
2. Throughput of 64-byte records through the other process and back,
   pipelined (records/s).
3. Handing a latent (64 KiB to 32 MiB) to another process until it holds
   a usable NumPy array and says so: the rte slab (a loan published, its
   reference in a 32-byte message, a read-only sample in place) against
   ``multiprocessing.Queue``, ``Pipe`` and pyzmq (zero-copy sends where they
   offer them).

Each figure is measured in ``--windows`` windows (default 5; each its own
server process and exchanges): the median over windows and its spread
(``tools.report``); ``x_floor``, ``x_ring``, ``x_slab`` are ratios of medians.

    python -m tools.bench_transport [--json] [--quick] [--windows 5]
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from shm import Doorbell, Ring, Segment, Slab, SlotRef, shm_name
from shm.segment import HEADER_SIZE
from tools import report

SPAWN = multiprocessing.get_context("spawn")
RING_CAPACITY = 1 << 16
SMALL = 64
LATENT_SIZES = [64 << 10, 1 << 20, 8 << 20, 32 << 20]
SPIN_NS = 10_000_000
SLOT = struct.Struct("<QQQQ")  # slot, generation, owner, nbytes: the whole slab message

zmq: Any
try:
    import zmq
except ImportError:  # pyzmq is optional: its rows are left out
    zmq = None


# -- shared-memory fixtures (one segment: two words, two rings, a slab) ----------


class Rig:
    """A segment with the floor's two words, a ring pair with doorbells, and a slab."""

    def __init__(self, slot_bytes: int, create: bool, name: str = "") -> None:
        self.name = name or f"bench{os.getpid()}x{uuid.uuid4().hex[:8]}"
        self.words = HEADER_SIZE
        self.rings = (HEADER_SIZE + 256, HEADER_SIZE + 256 + Ring.footprint(RING_CAPACITY))
        self.slab_at = self.rings[1] + Ring.footprint(RING_CAPACITY)
        size = self.slab_at + Slab.footprint(self.slab_at, 4, slot_bytes, 2)
        seg_name = shm_name(self.name, "seg")
        bells = (shm_name(self.name, "bell0"), shm_name(self.name, "bell1"))
        if create:
            self.segment = Segment.create(seg_name, size)
            self.bells = [Doorbell(b, create=True) for b in bells]
            for at in self.rings:
                Ring.create(self.segment, at, RING_CAPACITY, policy="spin")
            Slab.create(self.segment, self.slab_at, slots=4, slot_bytes=slot_bytes, max_owners=2)
        else:
            self.segment = Segment.open(seg_name)
            self.bells = [Doorbell(b) for b in bells]
        self.slab = Slab(self.segment, self.slab_at)
        self.slot_bytes = slot_bytes

    def ring(self, i: int, policy: str) -> Ring:
        return Ring(self.segment, self.rings[i], doorbell=self.bells[i], policy=policy)

    def close(self) -> None:
        self.segment.close()
        for bell in self.bells:
            bell.close()
        if self.segment.owner:
            self.segment.unlink()
            for bell in self.bells:
                bell.unlink()


# -- the other process ----------------------------------------------------------


def _server(kind: str, spec: dict[str, Any], endpoints: Any) -> None:
    """Echo or acknowledge ``spec['n']`` times, over the transport ``kind``."""
    n = spec["n"]
    if kind in ("floor", "ring-spin", "ring-spin-then-block", "slab"):
        rig = Rig(spec["slot_bytes"], create=False, name=spec["rig"])
        if kind == "floor":
            ping, pong = rig.segment.atomic(rig.words), rig.segment.atomic(rig.words + 128)
            for i in range(1, n + 1):
                while not ping.spin_until(i, SPIN_NS):  # acquire; pairs below
                    pass
                pong.store(i)
        elif kind == "slab":
            rx, tx = rig.ring(0, "spin-then-block"), rig.ring(1, "spin-then-block")
            for _ in range(n):
                slot, generation, owner, nbytes = SLOT.unpack(rx.pop(timeout=60))
                ref = SlotRef(slot, generation, owner)
                with rig.slab.receive(ref, np.uint8, (nbytes,)) as sample:
                    assert sample.array[0] == 7
                tx.push(b"ack", timeout=60)
        else:
            policy = kind.removeprefix("ring-")
            rx, tx = rig.ring(0, policy), rig.ring(1, policy)
            for _ in range(n):
                tx.push(rx.pop(timeout=60), timeout=60)
        rig.close()
    elif kind == "pipe":
        for _ in range(n):
            data = endpoints.recv_bytes()
            if spec["latent"]:
                assert np.frombuffer(data, np.uint8)[0] == 7
                data = b"ack"
            endpoints.send_bytes(data)
    elif kind == "queue":
        inbound, outbound = endpoints
        for _ in range(n):
            item = inbound.get(timeout=60)
            if spec["latent"]:
                assert item[0] == 7
                item = b"ack"
            outbound.put(item)
    elif kind == "zmq":
        sock: Any = zmq.Context.instance().socket(zmq.PAIR)
        sock.connect(spec["address"])
        for _ in range(n):
            frame = sock.recv(copy=False)
            if spec["latent"]:
                assert np.frombuffer(frame.buffer, np.uint8)[0] == 7
                sock.send(b"ack")
            else:
                sock.send(frame, copy=False)
        sock.close()


# -- the measuring side -----------------------------------------------------------


class _Peer:
    """The measuring side's end of one transport, with its server process running."""

    def __init__(self, kind: str, spec: dict[str, Any]) -> None:
        self.kind = kind
        self.rig: Rig | None = None
        self.here: Any = None
        endpoints: Any = None
        if kind in ("floor", "ring-spin", "ring-spin-then-block", "slab"):
            self.rig = Rig(spec["slot_bytes"], create=True)
            spec["rig"] = self.rig.name
        elif kind == "pipe":
            self.here, endpoints = SPAWN.Pipe()
        elif kind == "queue":
            endpoints = (SPAWN.Queue(), SPAWN.Queue())
            self.here = endpoints
        elif kind == "zmq":
            self.address = f"ipc:///tmp/rte-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            spec["address"] = self.address
            self.here = zmq.Context.instance().socket(zmq.PAIR)
            self.here.bind(self.address)
        self.server = SPAWN.Process(target=_server, args=(kind, spec, endpoints), daemon=True)
        self.server.start()

    def close(self) -> None:
        self.server.join(60)
        if self.server.is_alive():
            self.server.kill()
        if self.rig is not None:
            self.rig.close()
        if self.kind == "zmq":
            self.here.close(linger=0)
            os.unlink(self.address.removeprefix("ipc://"))


def _available(kind: str) -> bool:
    return kind != "zmq" or zmq is not None


def _measure(kind: str, n: int, latent: int | None, warmup: int) -> list[int]:
    """Run ``warmup + n`` timed exchanges; returns the last ``n`` in ns."""
    size = latent or SMALL
    spec: dict[str, Any] = {"n": n + warmup, "latent": latent is not None, "slot_bytes": size}
    peer = _Peer(kind, spec)
    try:
        exchange = _exchange(peer, size, latent is not None)
        samples = [exchange(i + 1) for i in range(n + warmup)]
    finally:
        peer.close()
    return samples[warmup:]


def _exchange(peer: _Peer, size: int, latent: bool) -> Callable[[int], int]:
    """One timed exchange (returns its ns) for each kind."""
    kind, rig, here = peer.kind, peer.rig, peer.here
    payload = np.full(size, 7, np.uint8)
    small = bytes(SMALL)
    if kind == "floor":
        assert rig is not None
        ping, pong = rig.segment.atomic(rig.words), rig.segment.atomic(rig.words + 128)

        def floor(i: int) -> int:
            t0 = time.perf_counter_ns()
            ping.store(i)  # pairs with the server's acquire
            while not pong.spin_until(i, SPIN_NS):
                pass
            return time.perf_counter_ns() - t0

        return floor
    if kind in ("ring-spin", "ring-spin-then-block"):
        assert rig is not None
        policy = kind.removeprefix("ring-")
        tx, rx = rig.ring(0, policy), rig.ring(1, policy)

        def ring(_: int) -> int:
            t0 = time.perf_counter_ns()
            tx.push(small, timeout=60)
            rx.pop(timeout=60)
            return time.perf_counter_ns() - t0

        return ring
    if kind == "slab":
        assert rig is not None
        tx, rx = rig.ring(0, "spin-then-block"), rig.ring(1, "spin-then-block")
        slab = rig.slab

        # The engine writes each latent once, straight into its slot; that write is
        # not the transport's, so it happens here, before timing, once per slot
        # (an aborted slot keeps its bytes). The other peers start from a ready array.
        loans = [slab.loan(1, np.uint8, (size,)) for _ in range(slab.slots)]
        for loan in loans:
            loan.array[:] = payload
            loan.abort()

        def handoff(_: int) -> int:
            loan = slab.loan(1, np.uint8, (size,))
            t0 = time.perf_counter_ns()
            ref = loan.publish()
            tx.push(SLOT.pack(*ref, size), timeout=60)
            rx.pop(timeout=60)
            return time.perf_counter_ns() - t0

        return handoff
    if kind == "pipe":

        def pipe(_: int) -> int:
            t0 = time.perf_counter_ns()
            here.send_bytes(payload if latent else small)
            here.recv_bytes()
            return time.perf_counter_ns() - t0

        return pipe
    if kind == "queue":
        outbound, inbound = here

        def queue(_: int) -> int:
            t0 = time.perf_counter_ns()
            outbound.put(payload if latent else small)
            inbound.get(timeout=60)
            return time.perf_counter_ns() - t0

        return queue

    def zmq_pair(_: int) -> int:
        t0 = time.perf_counter_ns()
        here.send(payload if latent else small, copy=not latent)
        here.recv(copy=False)
        return time.perf_counter_ns() - t0

    return zmq_pair


def _throughput(kind: str, n: int) -> float:
    """64-byte records per second pushed through the echo process and back, pipelined:
    the sender never waits for an echo, it drains whatever has come back."""
    peer = _Peer(kind, {"n": n, "latent": False, "slot_bytes": SMALL})
    small = bytes(SMALL)
    got = 0
    try:
        t0 = time.perf_counter()
        if peer.rig is not None:
            policy = kind.removeprefix("ring-") if kind.startswith("ring-") else "spin-then-block"
            tx, rx = peer.rig.ring(0, policy), peer.rig.ring(1, policy)
            for _ in range(n):
                tx.push(small, timeout=60)
                got += len(rx.pop_batch_nowait())
            while got < n:
                got += len(rx.pop_batch(timeout=60))
        elif kind == "pipe":
            for _ in range(n):
                peer.here.send_bytes(small)
                while peer.here.poll():
                    peer.here.recv_bytes()
                    got += 1
            while got < n:
                peer.here.recv_bytes()
                got += 1
        elif kind == "queue":
            outbound, inbound = peer.here
            for _ in range(n):
                outbound.put(small)
            for _ in range(n):
                inbound.get(timeout=60)
        else:
            for _ in range(n):
                peer.here.send(small)
                while peer.here.poll(0):
                    peer.here.recv()
                    got += 1
            while got < n:
                peer.here.recv()
                got += 1
        return n / (time.perf_counter() - t0)
    finally:
        peer.close()


SMALL_PEERS = ["floor", "ring-spin", "ring-spin-then-block", "pipe", "queue", "zmq"]
LATENT_PEERS = ["slab", "queue", "pipe", "zmq"]
LABELS = {
    "floor": "shm spin handoff (floor)",
    "ring-spin": "rte ring pair, spin",
    "ring-spin-then-block": "rte ring pair, spin-then-block",
    "slab": "rte slab + ring",
    "pipe": "multiprocessing.Pipe",
    "queue": "multiprocessing.Queue",
    "zmq": "pyzmq ipc PAIR",
}


def _stats(kind: str, n: int, latent: int | None, warmup: int) -> dict[str, float]:
    """One window of :func:`_measure`: its p50, p99 and mean."""
    return report.percentiles_us(_measure(kind, n, latent, warmup))


def _rate(kind: str, n: int) -> dict[str, float]:
    return {"records_per_s": _throughput(kind, n)}  # one window of _throughput


def run(quick: bool, n_windows: int = report.DEFAULT_WINDOWS, tiny: bool = False) -> dict[str, Any]:
    """Every table, each figure in ``n_windows`` windows; ``tiny``: a few
    exchanges of each kind and one latent size (for tests)."""
    trips, records = (20, 200) if tiny else (500, 5000) if quick else (2000, 20000)  # per window
    sizes = LATENT_SIZES[:1] if tiny else LATENT_SIZES
    small_kinds = list(filter(_available, SMALL_PEERS))
    latent_kinds = list(filter(_available, LATENT_PEERS))
    total = 2 * len(small_kinds) - 1 + len(sizes) * len(latent_kinds)
    progress = report.Progress("transport", total)
    small_rows: list[dict[str, Any]] = []
    for kind in small_kinds:
        window = functools.partial(_stats, kind, trips, None, 200)
        stats = progress.measure(f"64 B round trip, {LABELS[kind]}", window, n_windows, *P50)
        small_rows.append({"peer": LABELS[kind], "kind": kind, **stats})
    floor = next(r for r in small_rows if r["kind"] == "floor")["p50_us"]
    ring = next(r for r in small_rows if r["kind"] == "ring-spin")["p50_us"]
    for row in small_rows:
        row["x_floor"] = row["p50_us"] / floor
        row["x_ring"] = row["p50_us"] / ring
    for row in small_rows:
        if row["kind"] != "floor":
            window = functools.partial(_rate, row["kind"], records)
            rate = progress.measure(f"records/s, {row['peer']}", window, n_windows, *PER_S)
            row.update(rate)
    latent_rows: list[dict[str, Any]] = []
    for size in sizes:
        every = max(20, min(500, (64 << 20) // size)) // (4 if quick else 1)  # all windows'
        n = 3 if tiny else max(4 if quick else 8, every // n_windows)
        rows: list[dict[str, Any]] = []
        for kind in latent_kinds:
            window = functools.partial(_stats, kind, n, size, 5)
            what = f"{_size(size)} latent, {LABELS[kind]}"
            stats = progress.measure(what, window, n_windows, *P50)
            rows.append({"size": _size(size), "peer": LABELS[kind], "kind": kind, **stats})
        slab = next(r for r in rows if r["kind"] == "slab")["p50_us"]
        for row in rows:
            row["x_slab"] = row["p50_us"] / slab
        latent_rows.extend(rows)
    return {
        "bench": "transport",
        "machine": report.machine(),
        "windows": n_windows,
        "round_trip_64B": small_rows,
        "latent_handoff": latent_rows,
    }


P50, PER_S = ("p50_us", "µs"), ("records_per_s", "/s")
ROUND_TRIP = ["peer", "p50_us", "p99_us", "x_floor", "x_ring", "records_per_s"]
LATENT = ["size", "peer", "p50_us", "p99_us", "x_slab"]
TABLES: list[report.TableSpec] = [
    ("64-byte round trip to another process and back", "round_trip_64B", {}, ROUND_TRIP),
    ("Handing a latent to another process (until it holds an array)", "latent_handoff", {}, LATENT),
]


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument("--windows", type=int, default=report.DEFAULT_WINDOWS)
    args = parser.parse_args(argv)
    result = run(args.quick, args.windows)
    report.emit(result, TABLES, args.json)


if __name__ == "__main__":
    main()
