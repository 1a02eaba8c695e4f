"""Child-process bodies for the shm tests (importable, so the spawn start method works)."""

from __future__ import annotations

import os
import random
import struct
import time
import zlib
from typing import Any

import numpy as np

from shm import Doorbell, Ring, Segment, Slab, SlotRef

RECORD = struct.Struct("<QI")  # sequence number, crc32 of the payload


def make_record(seq: int, max_payload: int) -> bytes:
    rng = random.Random(seq)
    payload = rng.randbytes(rng.randrange(0, max_payload - RECORD.size + 1))
    return RECORD.pack(seq, zlib.crc32(payload)) + payload


def check_record(record: bytes, max_payload: int) -> int:
    """The record's sequence number, after checking it is whole and exactly as made."""
    seq, crc = RECORD.unpack_from(record)
    assert zlib.crc32(record[RECORD.size :]) == crc, f"record {seq} is torn"
    assert record == make_record(seq, max_payload), f"record {seq} differs"
    return int(seq)


def open_ring(
    seg_name: str, offset: int, bell: str | None, policy: str
) -> tuple[Segment, Ring, Doorbell | None]:
    segment = Segment.open(seg_name)
    doorbell = Doorbell(bell) if bell else None
    return segment, Ring(segment, offset, doorbell=doorbell, policy=policy), doorbell


def produce(
    seg_name: str,
    offset: int,
    bell: str | None,
    policy: str,
    count: int,
    max_payload: int,
    burst_pause: bool,
) -> None:
    """Push records 0..count-1; pause at random so the consumer goes to sleep often."""
    _, ring, _ = open_ring(seg_name, offset, bell, policy)
    rng = random.Random(count)
    for seq in range(count):
        ring.push(make_record(seq, max_payload), timeout=60)
        if burst_pause and rng.random() < 0.02:
            time.sleep(rng.random() * 0.002)


def produce_until_killed(seg_name: str, offset: int, max_payload: int) -> None:
    _, ring, _ = open_ring(seg_name, offset, None, "spin")
    seq = 0
    while True:
        try:
            ring.push_nowait(make_record(seq, max_payload))
            seq += 1
        except Exception:
            time.sleep(0)


def echo(
    seg_name: str, inbound: int, outbound: int, bells: tuple[str, str], policy: str, count: int
) -> None:
    """Pop a record from ``inbound`` and push it back on ``outbound``, ``count`` times."""
    segment = Segment.open(seg_name)
    rx = Ring(segment, inbound, doorbell=Doorbell(bells[0]), policy=policy)
    tx = Ring(segment, outbound, doorbell=Doorbell(bells[1]), policy=policy)
    for _ in range(count):
        tx.push(rx.pop(timeout=30), timeout=30)


def read_slot(seg_name: str, offset: int, ref: SlotRef, conn: Any) -> None:
    """Map the slab, receive one slot, report where its array lives and what it holds;
    on request, look again through the same array; then release the slot, and try a
    raw release of the same reference again (reporting the refusal)."""
    segment = Segment.open(seg_name)
    slab = Slab(segment, offset)
    sample = slab.receive(ref, np.float32, (256, 256))
    view = sample.array
    address = view.__array_interface__["data"][0]
    conn.send(
        {
            "pid": os.getpid(),
            "address": address,
            "segment": (segment.address, segment.address + segment.size),
            "readonly": not view.flags.writeable,
            "first": float(view[0, 0]),
        }
    )
    assert conn.poll(30)
    conn.recv()
    conn.send(float(view[0, 0]))  # the same array, read again
    assert conn.poll(30)
    if conn.recv() == "release":
        sample.release()
        sample.release()  # idempotent: no second C release
        try:
            slab.release(ref)
        except Exception as exc:
            conn.send(type(exc).__name__)
    del view, sample
    segment.close()


def hold_slots(seg_name: str, offset: int, refs: list[SlotRef], conn: Any) -> None:
    """Receive slots and never release them; the test kills this process."""
    segment = Segment.open(seg_name)
    slab = Slab(segment, offset)
    samples = [slab.receive(ref, np.uint8, (16,)) for ref in refs]
    conn.send(len(samples))
    time.sleep(60)


def create_and_exit(seg_name: str) -> None:
    Segment.create(seg_name, 8192).close()
