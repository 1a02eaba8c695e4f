"""Child-process bodies for tests/test_views_outlive.py (importable, for spawn).

Each holds views of shared memory past the moment their mapping is let go (a
segment closed, a client closed, a daemon killed, a pool member lost), then
reads them. Run in a child so that a SIGSEGV is the child's exit code, not the
end of the test run.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rte.client import ChunkBatch, EngineClient, EngineGone, ShmClient, connect_pool
from rte.contract import NoticeKind
from shm import Ring, Segment, SegmentError, Slab
from shm.names import unlink_segment
from shm.segment import HEADER_SIZE

DEADLINE_S = 30.0


def slab_views_outlive_close(name: str, form: str, conn: Any) -> None:
    """A writer's and a reader's views of ``form`` ("batch": a step's run of
    slots; "slot": a loan and a sample), read after both segments are closed;
    every later call on the closed slabs is refused, a give-back does nothing."""
    size = HEADER_SIZE + Slab.footprint(HEADER_SIZE, 4, 8192, 2)
    segment = Segment.create(name, size)
    try:
        writer = Slab.create(segment, HEADER_SIZE, slots=4, slot_bytes=8192, max_owners=2)
        reader = Slab.open_reader(name, HEADER_SIZE)
        held: list[Any] = []
        if form == "batch":
            loan = writer.loan_batch(0, 2, "u4", (1024,))
            loan.block[:] = np.arange(2 * 1024, dtype="u4").reshape(2, 1024)
            loan.publish()
            sample = reader.receive_batch(0, loan.slots, loan.generations, "u4", (1024,))
            views = [loan.block, sample.block]
            held = [sample, loan]
        else:
            kept = writer.loan(0, "u4", (2, 1024))  # never published
            kept.array[:] = np.arange(2 * 1024, dtype="u4").reshape(2, 1024)
            sent = writer.loan(1, "u4", (2, 1024))
            sent.array[:] = kept.array
            single = reader.receive(sent.publish(), "u4", (2, 1024))
            views = [kept.array, single.array]
            held = [single, kept]
        reader.segment.close()
        segment.close()
        seen = [int(view.sum()) for view in views]
        refused = []
        zero = memoryview(bytearray(8)).cast("Q")  # slot 0 at generation 0
        for call in (
            lambda: writer.loan(0, "u4", (4,)),
            lambda: writer.loan_batch(0, 1, "u4", (4,)),
            lambda: reader.receive_batch(0, zero, zero, "u4", (4,)),
            writer.statistics,
            held[1].publish,
        ):
            try:
                call()
                refused.append("not refused")
            except SegmentError as exc:
                refused.append(str(exc))
        held[0].release()  # after close: nothing to give back, and no crash
        held[1].abort()
        conn.send((seen, refused))
    finally:
        unlink_segment(name)


def _held(client: EngineClient, session: str) -> ChunkBatch:
    """A batch with a row of ``session``, held (others released)."""
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        batch = client.poll_batch(timeout=1.0)
        if batch is None:
            continue
        if session in batch.sessions:
            return batch
        batch.release()
    raise AssertionError(f"no chunk of {session} within {DEADLINE_S}s")


def _read(batch: ChunkBatch) -> list[float]:
    """Every row's bytes, summed: what a user reading a held chunk does."""
    rows = batch.latents if isinstance(batch.latents, list) else list(batch.latents)
    return [float(np.asarray(row, np.float64).sum()) for row in rows]


def chunk_outlives_close(name: str, conn: Any) -> None:
    """Hold a batch, close the client, read the batch, release it."""
    client = ShmClient(name, timeout=DEADLINE_S)
    client.attach("held")
    batch = _held(client, "held")
    before = _read(batch)
    client.close()
    after = _read(batch)
    batch.release()  # after close: a no-op
    conn.send((before, after))


def chunk_outlives_its_daemon(name: str, conn: Any) -> None:
    """Hold a batch; once the parent has killed the daemon, poll until the client
    knows (EngineGone), close it, read the batch."""
    client = ShmClient(name, timeout=DEADLINE_S)
    client.attach("held")
    batch = _held(client, "held")
    before = _read(batch)
    conn.send("holding")
    assert conn.recv() == "killed"
    end = time.monotonic() + DEADLINE_S
    gone = ""
    while not gone:
        assert time.monotonic() < end, "the client never saw its daemon die"
        try:
            client.poll_batch(timeout=0.2)
        except EngineGone as exc:
            gone = str(exc)
    client.close()
    conn.send((before, _read(batch), gone))


def chunk_outlives_a_lost_pool_member(names: list[str], conn: Any) -> None:
    """Hold a batch of each daemon's session; the parent kills the home of
    ``b``; poll the pool until it has lost that member (and closed it), then
    read the held batch from the dead daemon."""
    pool = connect_pool(names, timeout=DEADLINE_S)
    pool.attach("a")
    pool.attach("b")
    homes = {s: pool.home[s] for s in ("a", "b")}
    assert homes["a"] != homes["b"], homes
    held = _held(pool, "b")
    before = _read(held)
    conn.send(homes)
    assert conn.recv() == "killed"
    end = time.monotonic() + DEADLINE_S
    lost: list[str] = []
    while not lost:
        assert time.monotonic() < end, "the pool never lost the killed daemon"
        batch = pool.poll_batch(timeout=0.2)
        if batch is not None:
            batch.release()
        lost += [n.message for n in pool.notices() if n.kind is NoticeKind.ERROR]
    assert pool.members[homes["b"]].closed, "the lost member was not closed"
    after = _read(held)
    held.release()
    pool.close()
    conn.send((before, after, lost[0]))


def ring_calls_after_close(name: str, conn: Any) -> None:
    """Every call on a ring whose segment is closed: refused, never a crash."""
    segment = Segment.create(name, HEADER_SIZE + Ring.footprint(4096))
    try:
        ring = Ring.create(segment, HEADER_SIZE, 4096, policy="spin")
        ring.push_nowait(b"kept")
        segment.close()
        refused = []
        for call in (
            lambda: ring.push_nowait(b"x"),
            ring.pop_nowait,
            ring.pop_batch_nowait,
            ring.used,
            ring.statistics,
            lambda: ring.peek(0),
        ):
            try:
                call()
                refused.append("not refused")
            except SegmentError as exc:
                refused.append(str(exc))
        conn.send(refused)
    finally:
        unlink_segment(name)
