"""A client's STEP records judged in C as they are popped, against the Python reference.

``ShmTransport.receive`` pops its outbox and judges each record in one C call
(:func:`rte.protocol.steps.step_reader`, ``shm_ring_pop_rows``): a STEP whole,
its handles in range, its slots published at their generations; the batch is
then viewed from that verdict (:meth:`shm.BatchSample.judged`). The Python
reference (``judging`` False; ``RTE_PURE_PYTHON=1``) decodes and checks each
record itself. Here both read the very same records, taken from a stopped
daemon's ring and pushed back: the same batches, byte for byte, and the same
refusals, word for word, of records that lie.
"""

from __future__ import annotations

import os
import signal
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from daemon_harness import DaemonProcess, wait_for

from rte.client import ChunkBatch, ShmClient
from rte.client.shm import StepLease
from rte.contract import Notice, NoticeKind
from rte.protocol.steps import NOT_JUDGED
from rte.protocol.wire import (
    HEADER,
    STEP_AT,
    decode_reply,
    encode_notice,
    encode_step,
    stamp_pushed,
)

SESSIONS = 4  # attached, of the daemon's 8 handles (4 to 7 name nobody)


@pytest.fixture
def stopped(shm_prefix: str) -> Iterator[ShmClient]:
    """A client of 4 sessions whose daemon is stopped (SIGSTOP) with steps in its outbox:
    the test is the ring's only producer until it ends."""
    d = DaemonProcess(shm_prefix, "--model", "null", "--max-sessions", "8", "--max-clients", "1")
    try:
        client = d.client()
        try:
            for i in range(SESSIONS):
                client.attach(f"s{i}", credits=2)
            while (batch := client.poll_batch(timeout=0)) is not None:
                batch.release()  # what came while attaching: its credits back
            wait_for(lambda: client.transport.outbox.used() > 0, what="a step in the outbox")
            os.kill(d.pid, signal.SIGSTOP)
            try:
                yield client
            finally:
                os.kill(d.pid, signal.SIGCONT)
        finally:
            client.close()
    finally:
        assert d.stop() == 0, d.stderr


def _nothing(batch: ChunkBatch, rows: Any) -> None:
    return None


def _receive(client: ShmClient, records: list[bytes], judging: bool) -> list[Any]:
    """``records`` pushed into the client's outbox, then received on one path."""
    transport = client.transport
    for record in records:
        transport.outbox.push_nowait(record)
    transport.judging = judging
    got = transport.receive(_nothing)
    assert not transport.outbox.used()
    return got


def _pending(client: ShmClient) -> list[bytes]:
    ring, out = client.transport.outbox, []
    while (record := ring.peek(len(out))) is not None:
        out.append(record)
    ring.pop_batch_nowait()  # taken, to be pushed again for each path
    return out


def _hold(lease: Any) -> Any:
    """What a batch's lease holds, on either path: the slots and generations it
    gives back, for whom, and the sessions (handle, binding) it credits."""
    step = lease.step if isinstance(lease, StepLease) else lease.sample  # the C's: the record
    seen = lease.seen
    held = (bytes(step.slots), bytes(step.generations), lease.transport.index)
    return held, (seen.sessions, seen.handles, seen.tokens, bytes(seen.index), lease.bindings)


def _face(item: Any) -> Any:
    """What a caller can see of an arrival, and where its latents lie."""
    if not isinstance(item, ChunkBatch):
        return item
    latents = [item.latents] if item.contiguous else list(item.latents)
    return (
        item.sessions,
        item.chunks.tobytes(),
        item.generated_ns.tobytes(),
        item.applied.tobytes(),
        (item.emitted_ns, item.pushed_ns, item.contiguous, len(item)),
        [(a.__array_interface__["data"], a.shape, a.strides, a.dtype.str) for a in latents],
        [a.tobytes() for a in latents],
        _hold(item.lease),
    )


def _rows(records: list[bytes]) -> list[tuple[int, int, int, int]]:
    """(slot, generation, chunk, handle) of every row of these STEP records."""
    rows = []
    for record in records:
        step = decode_reply(record)
        if not isinstance(step, Notice):
            rows += zip(step.slots, step.generations, step.chunks, step.handles, strict=True)
    return rows


def _step(rows: list[tuple[int, int, int, int]], contiguous: bool = False) -> bytes:
    slots = np.array([r[0] for r in rows], np.uint64)
    generations = np.array([r[1] for r in rows], np.uint64)
    record = encode_step(
        slots,
        generations,
        [r[2] for r in rows],
        [7] * len(rows),
        [r[3] for r in rows],
        contiguous=contiguous,
        emitted_ns=5,
        applied=[3] * len(rows),
    )
    stamp_pushed(record, 9)
    return bytes(record)


def test_both_paths_make_the_same_batches_byte_for_byte(stopped: ShmClient) -> None:
    records = _pending(stopped)
    rows = _rows(records)
    assert rows, records
    crafted = [_step(rows[:1]), _step(rows[::-1])]  # one row; every ready row, backwards
    # a notice between steps: the records after it lie unaligned in the C's buffer
    odd = encode_notice(Notice("s0", NoticeKind.ERROR, "odd", 0), 4096)
    every = [*records, odd, *crafted]
    histogram = stopped.transport.slot.mailbox.block.histogram  # type: ignore[union-attr]
    before = sum(histogram.words)
    judged = _receive(stopped, every, judging=True)
    timed = sum(histogram.words) - before  # each step delivered timed once, in the C
    reference = _receive(stopped, every, judging=False)
    assert [_face(a) for a in judged] == [_face(b) for b in reference]
    assert (
        timed
        == sum(histogram.words) - before - timed
        == len(records) + 2 - sum(isinstance(decode_reply(r), Notice) for r in records)
    )
    batches = [a for a in judged if isinstance(a, ChunkBatch)]
    assert len(batches) == len(records) + 2 - sum(
        isinstance(decode_reply(r), Notice) for r in records
    )
    if len(rows) > 2:
        assert not batches[-1].contiguous  # backwards: viewed slot by slot, on both paths


def _lies(good: bytes, generation: int) -> dict[str, bytes]:
    """Records that lie, each made from one good STEP row (slot, generation, handle 0)."""
    n_at = HEADER.size  # STEP's n, the first word after the header
    at_handle, at_generation = STEP_AT + 32, STEP_AT + 8

    def with_word(code: str, at: int, value: int) -> bytes:
        record = bytearray(good)
        struct.pack_into(code, record, at, value)
        return bytes(record)

    return {
        "short head": good[: STEP_AT - 1],
        "header only": good[: HEADER.size],
        "one byte short": good[:-1],
        "one word long": good + b"\0" * 8,
        "no rows": with_word("<I", n_at, 0),
        "two rows said": with_word("<I", n_at, 2),
        "rows past memory": with_word("<I", n_at, 0xFFFFFFFF),
        "handle past the client's": with_word("<I", at_handle, 8),
        "handle huge": with_word("<I", at_handle, 0xFFFFFFFF),
        "handle of nobody": with_word("<I", at_handle, 6),
        "slot past the slab": with_word("<Q", STEP_AT, 1 << 40),
        "slot at 2**63": with_word("<Q", STEP_AT, 1 << 63),
        "stale generation": with_word("<Q", at_generation, generation + 1),
        "unknown type": bytes([99]) + good[1:],
    }


def test_records_that_lie_are_refused_the_same_way_on_both_paths(stopped: ShmClient) -> None:
    records = _pending(stopped)
    slot, generation, chunk, _ = _rows(records)[0]
    good = _step([(slot, generation, chunk, 0)])
    lies = _lies(good, generation)
    every = [*lies.values(), good]  # and a good record after them: read as ever
    for record in every:
        stopped.transport.outbox.push_nowait(record)
    verdicts = [first for _, first in stopped.transport.reader.pop()]
    # the lies left to the reference; a handle in range, the C passes: whether it
    # names a session is the transport's to say, on either path
    expected = [slot if name == "handle of nobody" else NOT_JUDGED for name in lies]
    assert verdicts == [*expected, slot]
    words = stopped.transport.slot.mailbox.block.histogram.words  # type: ignore[union-attr]
    before = sum(words)
    judged = _receive(stopped, every, judging=True)
    timed = sum(words) - before
    reference = _receive(stopped, every, judging=False)
    assert [_face(a) for a in judged] == [_face(b) for b in reference]
    # timed: every STEP whole whose slots were ready (then refused for its handles, or read)
    assert timed == sum(words) - before - timed == 4
    *refusals, last = judged
    assert isinstance(last, ChunkBatch) and last.sessions == ["s0"]
    assert len(refusals) == len(lies)
    for name, refusal in zip(lies, refusals, strict=True):
        assert isinstance(refusal, Notice), name
        assert refusal.kind is NoticeKind.ERROR, name
        assert refusal.message.startswith("unreadable record: "), name
    said = dict(zip(lies, (r.message for r in refusals), strict=True))
    assert "does not match" in said["two rows said"]
    assert "too short" in said["short head"]
    assert "not all attached" in said["handle of nobody"]
    assert "does not exist" in said["slot past the slab"]
    assert "is not published" in said["stale generation"]
