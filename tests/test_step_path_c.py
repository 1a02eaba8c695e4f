"""The STEP record written into the ring in place (C) is the one the Python encodes.

:func:`rte.protocol.steps.push_step` (``shm_ring_push_rows``) and the Python
reference (:func:`~rte.protocol.wire.encode_step`, ``stamp_pushed``, a push)
must leave the same bytes in the ring; a full ring takes nothing; and a daemon
delivers whole steps on either path (``RTE_PURE_PYTHON=1`` selects the Python).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from daemon_harness import DaemonProcess, Deadline

from rte.protocol.steps import IN_PLACE_MIN_ROWS, push_step, send_step
from rte.protocol.wire import StepColumns, decode_reply, encode_step, stamp_pushed
from shm import RecordTooLarge, Ring, Segment, SegmentError
from shm.segment import HEADER_SIZE

CAPACITY = 1 << 13


@pytest.fixture
def ring(shm_prefix: str) -> Iterator[Ring]:
    segment = Segment.create(f"{shm_prefix}ring", HEADER_SIZE + Ring.footprint(CAPACITY))
    try:
        yield Ring.create(segment, HEADER_SIZE, CAPACITY, policy="spin")
    finally:
        segment.close()
        segment.unlink()


def columns(n: int, per_row_times: bool, receipts: bool) -> tuple[dict[str, object], list[object]]:
    slots = np.arange(7, 7 + n, dtype=np.uint64)
    generations = memoryview(bytearray(np.arange(n, dtype=np.uint64) * 3 + 1)).cast("Q")
    generated: object = list(range(100, 100 + n)) if per_row_times else 55
    args: list[object] = [slots, generations, list(range(n)), generated, list(range(n))[::-1]]
    step = {"contiguous": n % 2 == 1, "emitted_ns": 20, "applied": [9] * n if receipts else None}
    return step, args


@pytest.mark.parametrize("n", [1, 3, 64])
@pytest.mark.parametrize("per_row_times", [False, True])
@pytest.mark.parametrize("receipts", [False, True])
def test_the_record_pushed_in_place_is_the_one_python_encodes(
    ring: Ring, n: int, per_row_times: bool, receipts: bool
) -> None:
    step, args = columns(n, per_row_times, receipts)
    pushed = push_step(ring, *args, **step)  # type: ignore[arg-type]
    assert pushed > 0
    record = ring.pop_nowait()
    reference = encode_step(*args, **step)  # type: ignore[arg-type]
    stamp_pushed(reference, pushed)
    assert record == bytes(reference)
    decoded = decode_reply(record)
    assert isinstance(decoded, StepColumns) and decoded.pushed_ns == pushed


def test_records_in_place_go_round_the_ring_whole(ring: Ring) -> None:
    step, args = columns(20, True, True)  # 760 bytes: ten records fill the ring
    for _ in range(40):
        pushed = push_step(ring, *args, **step)  # type: ignore[arg-type]
        reference = encode_step(*args, **step)  # type: ignore[arg-type]
        stamp_pushed(reference, pushed)
        assert ring.pop_nowait() == bytes(reference)
    assert ring.statistics().bytes_pushed > 4 * CAPACITY


def test_a_full_ring_takes_nothing_and_counts_no_full_event(ring: Ring) -> None:
    step, args = columns(20, False, False)
    while push_step(ring, *args, **step):  # type: ignore[arg-type]
        pass
    before = ring.statistics()
    assert push_step(ring, *args, **step) == 0  # type: ignore[arg-type]
    after = ring.statistics()
    assert (after.used_bytes, after.pushed, after.full_events) == (
        before.used_bytes,
        before.pushed,
        before.full_events,
    )


def test_a_sleeping_consumer_is_told(ring: Ring) -> None:
    step, args = columns(1, False, False)
    assert not ring.prepare_sleep()  # empty: it would sleep
    push_step(ring, *args, **step)  # type: ignore[arg-type]
    assert ring.statistics().wakeups == 1 and not ring.statistics().consumer_sleeping


def test_bad_columns_are_refused_before_the_c_reads_them(ring: Ring) -> None:
    step, args = columns(4, True, True)
    short = [*args[:2], [0, 1], *args[3:]]
    with pytest.raises(ValueError, match="every column of 4"):
        push_step(ring, *short, **step)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="3 generation times"):
        push_step(ring, *args[:3], [1, 2, 3], args[4], **step)  # type: ignore[arg-type]
    huge, big_args = columns(CAPACITY // 36, False, False)
    with pytest.raises(RecordTooLarge):
        push_step(ring, *big_args, **huge)  # type: ignore[arg-type]
    assert ring.used() == 0
    ring.segment.close()
    with pytest.raises(SegmentError):
        push_step(ring, *args, **step)  # type: ignore[arg-type]


def test_a_record_queued_before_keeps_the_next_one_behind_it(ring: Ring) -> None:
    step, args = columns(IN_PLACE_MIN_ROWS, False, False)
    sent: list[bytearray] = []
    pushed = send_step(ring, lambda r: sent.append(r) is None, True, *args, **step)  # type: ignore[arg-type]
    assert pushed and len(sent) == 1 and ring.used() == 0  # queued, not pushed past the backlog
    assert send_step(ring, lambda r: False, False, *args, **step) > 0  # type: ignore[arg-type]
    assert ring.used() > 0  # room and nothing queued: in place


def test_pure_python_is_selected_by_the_environment() -> None:
    code = "import rte.protocol.steps as s; print(s.IN_PLACE)"  # (a client's judging too)
    env = {"RTE_PURE_PYTHON": "1", "PATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True
    )
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("pure", ["0", "1"], ids=["c", "python"])
def test_a_daemon_delivers_whole_steps_on_either_path(shm_prefix: str, pure: str) -> None:
    args = ("--model", "null", "--ring-kib", "4", "--max-sessions", "32", "--max-clients", "1")
    d = DaemonProcess(shm_prefix, *args, "--slab-slots", "128", env={"RTE_PURE_PYTHON": pure})
    try:
        with d.client() as client:
            client.transport.judging = pure == "0"  # the client's side too (the C pop and judge)
            for i in range(32):
                client.attach(f"s{i}")
            last: dict[str, int] = {}
            full = 0
            limit = Deadline(what="40 steps of all 32 sessions")
            while full < 40:  # round the 4 KiB ring many times
                limit.check(full)
                batch = client.poll_batch(timeout=10)
                if batch is None:
                    continue
                with batch:
                    full += len(batch) == 32
                    for session, chunk in zip(batch.sessions, batch.chunks.tolist(), strict=True):
                        assert chunk == last.get(session, -1) + 1, session  # none lost
                        last[session] = chunk
    finally:
        assert d.stop() == 0, d.stderr
