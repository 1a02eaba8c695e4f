"""The boundary costs per step: a step's chunks as one batch, and run-ahead by credits.

The slab hands a writer a step's slots in one call, as one run when one is
free; the reader checks and releases them in one call. Clients hand out a
step's chunks as a :class:`~rte.client.ChunkBatch` (``poll_batch``), and each
session runs at most its credits ahead of its consumer. Behaviour only: no
test here times anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest
from daemon_harness import DaemonProcess, Deadline, take
from test_client import Engines

from rte.client import Chunk, ChunkBatch, EngineClient
from rte.models.null import tag_of
from shm import ForeignSlot, QuotaExceeded, Segment, Slab, SlabFull, StaleSlot
from shm.segment import HEADER_SIZE

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams


@pytest.fixture
def slab(shm_prefix: str) -> Iterator[Slab]:
    size = HEADER_SIZE + Slab.footprint(HEADER_SIZE, 8, 100, 2)
    segment = Segment.create(f"{shm_prefix}slab", size)
    try:
        yield Slab.create(segment, HEADER_SIZE, slots=8, slot_bytes=100, max_owners=2, quota=6)
    finally:
        segment.close()
        segment.unlink()


# -- the slab: a step's slots in one call -----------------------------------------------


def test_a_batch_is_one_run_of_slots_viewed_as_one_array_in_place(slab: Slab) -> None:
    loan = slab.loan_batch(0, 3, "f4", (5,))
    assert loan.contiguous and loan.block is not None
    assert loan.slots.tolist() == [0, 1, 2]
    assert loan.block.shape == (3, 5) and loan.block.strides == (slab.slot_size, 4)
    for i, row in enumerate(loan.rows):  # the rows are the slots' own bytes
        assert row.ctypes.data == slab.slot_address(i)
    loan.block[:] = np.arange(15, dtype="f4").reshape(3, 5)
    loan.publish()
    sample = slab.receive_batch(0, loan.slots, loan.generations, "f4", (5,))
    assert sample.block is not None and not sample.block.flags.writeable
    assert sample.block.ctypes.data == slab.slot_address(0)
    assert sample.block.tolist() == np.arange(15).reshape(3, 5).tolist()
    before = slab.statistics().released
    assert sample.release() == 3  # one call gives back all three
    assert slab.statistics().released == before + 3 and slab.held(0) == 0
    assert sample.release() == 0  # and a second does nothing


def test_without_a_free_run_the_batch_takes_scattered_slots(slab: Slab) -> None:
    hold = [slab.loan_batch(1, 1, "u1", (1,)) for _ in range(2)]  # slots 0, 1
    middle = slab.loan_batch(1, 1, "u1", (1,))  # slot 2
    hold[0].abort()  # free: 0 and 3-7; no run of 6
    loan = slab.loan_batch(0, 6, "u1", (1,))
    assert not loan.contiguous and loan.block is None
    assert sorted(loan.slots.tolist()) == [0, 3, 4, 5, 6, 7]
    assert [r.ctypes.data for r in loan.rows] == [slab.slot_address(s) for s in loan.slots]
    loan.abort()
    middle.abort()
    hold[1].abort()
    assert slab.statistics().held == 0


def test_a_run_never_wraps_past_the_last_slot(slab: Slab) -> None:
    first = slab.loan_batch(0, 6, "u1", (1,))  # slots 0-5; the hint now points at 6
    first.abort()  # all free again, and the search starts at 6, where 3 do not fit
    loan = slab.loan_batch(0, 3, "u1", (1,))
    assert loan.contiguous and loan.slots.tolist() == [0, 1, 2]  # not 6, 7, 0
    loan.abort()


def test_a_run_taken_again_is_viewed_by_the_same_rows_each_loan_its_own_list(
    slab: Slab,
) -> None:
    """A writer takes the same few runs step after step: their views are made once
    (shm.slab_core.SlabCore.run), written through as fresh ones are, and each loan
    gets its own list of them, so nothing a model does to one loan's list reaches
    the next."""
    first = slab.loan_batch(0, 3, "f4", (5,))
    rows, block = first.rows, first.block
    first.rows[0] = np.zeros(5, "f4")  # a model that replaced a row in its list
    first.abort()
    other = slab.loan_batch(0, 3, "f4", (5,))
    assert other.slots.tolist() == [3, 4, 5] and other.block is not block  # another run
    other.abort()
    loan = slab.loan_batch(0, 3, "f4", (5,))  # 6, 7 hold no run of 3: back to 0
    assert loan.slots.tolist() == [0, 1, 2]
    assert loan.block is block and loan.rows is not rows  # the views again, a new list
    assert [r.ctypes.data for r in loan.rows] == [slab.slot_address(s) for s in range(3)]
    loan.rows[1][:] = 7  # written through: the reader sees it
    loan.publish()
    sample = slab.receive_batch(0, loan.slots, loan.generations, "f4", (5,))
    assert sample.block is not None and sample.block[1].tolist() == [7.0] * 5
    assert sample.release() == 3 and slab.statistics().held == 0


def test_a_batch_is_all_or_nothing(slab: Slab) -> None:
    with pytest.raises(QuotaExceeded, match="asked for 7 at once"):
        slab.loan_batch(0, 7, "u1", (1,))  # quota 6
    taken = slab.loan_batch(1, 5, "u1", (1,))
    with pytest.raises(SlabFull):
        slab.loan_batch(0, 4, "u1", (1,))  # 3 free
    assert slab.held(0) == 0 and slab.statistics().held == 5
    taken.abort()


def test_a_reader_checks_every_slot_and_gives_back_rows_alone(slab: Slab) -> None:
    loan = slab.loan_batch(0, 4, "u1", (8,))
    loan.publish()
    stale = np.array(loan.generations)
    stale[2] += 1
    with pytest.raises(StaleSlot, match="slot 2 generation"):
        slab.receive_batch(0, loan.slots, stale, "u1", (8,))
    sample = slab.receive_batch(0, loan.slots, loan.generations, "u1", (8,))
    assert sample.release_rows(np.array([1, 3])) == 2
    assert sample.release_rows(np.array([1])) == 0  # idempotent per row
    assert slab.held(0) == 2
    assert slab.reclaim(0) == 2  # the owner is taken for dead meanwhile
    with pytest.raises(StaleSlot):
        sample.release()  # what was reclaimed is skipped, and said


def test_a_batch_is_its_owners_alone(slab: Slab) -> None:
    loan = slab.loan_batch(0, 2, "u1", (4,))
    loan.publish()
    foreign = slab.receive_batch(1, loan.slots, loan.generations, "u1", (4,))
    with pytest.raises(ForeignSlot):
        foreign.release()  # owner 1 cannot give back owner 0's slots
    assert slab.held(0) == 2 and slab.statistics().foreign_refused == 2
    mine = slab.receive_batch(0, loan.slots, loan.generations, "u1", (4,))
    assert mine.release() == 2 and slab.held(0) == 0
    with pytest.raises(StaleSlot):  # and a batch given back is nobody's to read
        slab.receive_batch(0, loan.slots, loan.generations, "u1", (4,))


# -- clients: poll_batch, on both forms ---------------------------------------------------


@pytest.fixture
def python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python reference on both sides: the daemon's STEP records packed in
    Python (RTE_PURE_PYTHON=1), this process's clients decoding them in Python."""
    monkeypatch.setenv("RTE_PURE_PYTHON", "1")
    monkeypatch.setattr("rte.client.shm.IN_PLACE", False)


@pytest.fixture(params=["c", "python"])
def each_path(request: pytest.FixtureRequest) -> None:
    """Over shared memory: the C paths, then the Python reference."""
    if request.param == "python":
        request.getfixturevalue("python_path")


@pytest.fixture(params=["inprocess", "shm", "shm-python"])
def engine(request: pytest.FixtureRequest, shm_prefix: str) -> Iterator[Engines]:
    if request.param == "shm-python":
        request.getfixturevalue("python_path")
    engines = Engines(request.param.removesuffix("-python"), shm_prefix)
    yield engines
    engines.close()


def _batch(client: EngineClient, size: int) -> ChunkBatch:
    """The next batch of ``size`` chunks (smaller ones, from the first steps, released)."""
    limit = Deadline(what=f"a batch of {size}")
    while True:
        limit.check()
        batch = client.poll_batch(timeout=10)
        if batch is not None and len(batch) == size:
            return batch
        if batch is not None:  # sessions out of step: line their credits up again
            batch.release()
            for held in _until_quiet(client):
                held.release()


def _until_quiet(client: EngineClient) -> list[ChunkBatch]:
    """Every batch that comes until none has for a while (all sessions out of credit)."""
    held = []
    while (batch := client.poll_batch(timeout=0.3)) is not None:
        held.append(batch)
    return held


def test_a_step_is_one_batch_one_array_released_in_one_call(engine: Engines) -> None:
    client = engine.client()
    for name in ("a", "b", "c"):
        client.attach(name)
    for _ in range(3):  # past the joins: rows made at one step, decoded at the next
        _batch(client, 3).release()
    batch = _batch(client, 3)
    shape = client.manifest.latent_shape
    assert sorted(batch.sessions) == ["a", "b", "c"]
    assert batch.contiguous and isinstance(batch.latents, np.ndarray)
    assert batch.latents.shape == (3, *shape) and not batch.latents.flags.writeable
    assert batch.chunks.dtype == np.int64
    assert batch.generated_ns.min() <= batch.emitted_ns <= batch.pushed_ns <= batch.taken_ns
    assert client.held() == 3
    batch.release()
    assert client.held() == 0 and batch.released
    batch.release()  # idempotent
    assert client.held() == 0
    nxt = _batch(client, 3)  # the sessions go on: their credits came back
    before = dict(zip(batch.sessions, batch.chunks.tolist(), strict=True))
    after = dict(zip(nxt.sessions, nxt.chunks.tolist(), strict=True))
    assert all(after[s] > before[s] for s in before)
    nxt.release()


def test_poll_hands_out_a_batch_a_chunk_at_a_time(engine: Engines) -> None:
    client = engine.client()
    client.attach("a")
    client.attach("b")
    limit = Deadline(what="a step of two chunks")
    while True:  # a step may carry one session only (the other out of credit): retry
        limit.check()
        for held in _until_quiet(client):  # both out of credit: give all back at once,
            held.release()  # so that the next step carries both sessions
        first = client.poll(timeout=10)
        assert first is not None and first.timing.taken_ns >= first.timing.pushed_ns
        rest = client.poll_batch(timeout=10)  # the rest of first's step, if it had a rest
        assert rest is not None
        if rest.emitted_ns == first.timing.emitted_ns:  # the same step
            break
        first.release()
        rest.release()
    assert len(rest) == 1 and rest.sessions != [first.session]
    assert client.held() == 2
    first.release()
    rest.release()
    assert client.held() == 0


def test_a_session_runs_at_most_its_credits_ahead(engine: Engines) -> None:
    client = engine.client("null")
    client.attach("one", credits=1)
    client.attach("three", credits=3)
    held: dict[str, list[int]] = {"one": [], "three": []}
    batches = []
    limit = Deadline(5, "chunks up to the credits")
    while len(held["one"]) < 1 or len(held["three"]) < 3:
        limit.check(held)
        batch = client.poll_batch(timeout=0.5)
        if batch is not None:
            batches.append(batch)
            for session, chunk in zip(batch.sessions, batch.chunks.tolist(), strict=True):
                held[session].append(chunk)
    assert client.poll_batch(timeout=0.5) is None  # nothing more while nothing is released
    assert {k: len(v) for k, v in held.items()} == {"one": 1, "three": 3}
    for batch in batches:
        batch.release()
    more = take(client, "one", 2)  # releasing gives the credits back
    assert [c.chunk for c in more] == [held["one"][0] + 1, held["one"][0] + 2]


def _until_quiet(client: EngineClient) -> list[ChunkBatch]:
    """Every batch that comes until none has for a while (all sessions out of credit)."""
    held = []
    while (batch := client.poll_batch(timeout=0.3)) is not None:
        held.append(batch)
    return held


def _one_step_by_chunk(client: EngineClient, size: int) -> list[Chunk]:
    """``size`` chunks of one step, taken by ``poll`` (sessions of one credit each)."""
    limit = Deadline(what=f"a step of {size} taken a chunk at a time")
    while True:
        limit.check()
        _batch(client, size).release()  # every credit back in one call: the next step has all
        chunks = [client.poll(timeout=10) for _ in range(size)]
        assert all(chunks), "a step's chunks did not come"
        got = [c for c in chunks if c is not None]
        if len({c.timing.emitted_ns for c in got}) == 1:
            return got
        for chunk in got:
            chunk.release()


def test_chunks_released_one_at_a_time_give_back_their_credit_before_the_next_wait(
    engine: Engines,
) -> None:
    # The per-chunk API gives a step's released rows back together (issue 27): a
    # release with a chunk of its step still held must still be back before the
    # client waits, or the sessions it freed would stall behind the held one.
    client = engine.client("null")
    for name in ("a", "b", "c"):
        client.attach(name, credits=1)
    a, b, c = sorted(_one_step_by_chunk(client, 3), key=lambda chunk: chunk.session)
    a.release()
    b.release()
    assert a.released and client.held() == 1  # counted at once
    nxt = client.poll(timeout=10)  # only a and b have credit: their releases went back
    assert nxt is not None and nxt.session in ("a", "b")
    assert nxt.chunk == {"a": a, "b": b}[nxt.session].chunk + 1
    nxt.release()
    c.release()
    assert client.held() == 0


def test_a_step_is_one_batch_even_when_its_rows_were_made_apart(engine: Engines) -> None:
    # Regression: a session that sat steps out (no credit) is decoded with rows made
    # at another step; that step still reaches its client as one batch (was: two).
    client = engine.client("null")
    client.attach("slow", credits=1)
    client.attach("fast", credits=1)
    held: ChunkBatch | None = None  # the batch holding "slow"'s chunk
    waited = 0  # batches of "fast" alone while "slow" waits
    steps: list[int] = []
    mixed = 0
    limit = Deadline(what="steps of both sessions after a wait")
    while mixed < 3:
        limit.check(len(steps))
        batch = client.poll_batch(timeout=10)
        if batch is None:
            continue
        assert batch.emitted_ns not in steps, "a step arrived as more than one batch"
        steps.append(batch.emitted_ns)
        mixed += len(batch) == 2 and waited == 0 and len(steps) > 4
        for i, session in enumerate(batch.sessions):
            if session == "fast":
                batch.release_row(i)
            elif held is None:
                held, waited = batch, 0
            else:
                batch.release_row(i)
        if held is not None and (waited := waited + 1) > 3:  # let "slow" go on
            held.release()
            held, waited = None, 0


def test_tags_reach_their_rows(engine: Engines) -> None:
    client = engine.client("null")
    names = ["a", "b", "c"]
    for name in names:
        client.attach(name)
    for i, name in enumerate(names):
        client.act(name, {"tag": 10 + i})
    seen: dict[str, int] = {}
    limit = Deadline(what="every tag in its own row")
    while len(seen) < 3:
        limit.check(seen)
        batch = client.poll_batch(timeout=10)
        if batch is None:
            continue
        with batch:
            for session, latent in zip(batch.sessions, batch.latents, strict=True):
                if tag_of(latent) == 10 + names.index(session):
                    seen[session] = tag_of(latent)
    assert seen == {"a": 10, "b": 11, "c": 12}


# -- over shared memory only -----------------------------------------------------------


@pytest.mark.usefixtures("each_path")
def test_steps_straddling_the_rings_wrap_arrive_whole(shm_prefix: str) -> None:
    # 4 KiB rings: a STEP record of 32 chunks (1.2 KiB) is over a quarter of one
    d = DaemonProcess(
        shm_prefix,
        "--model",
        "null",
        "--ring-kib",
        "4",
        "--max-sessions",
        "32",
        *("--max-clients", "1", "--slab-slots", "128"),
    )
    try:
        with d.client() as client:
            names = [f"s{i}" for i in range(32)]
            for name in names:
                client.attach(name)
            last: dict[str, int] = {}
            full = 0
            limit = Deadline(what="60 steps of all 32 sessions")
            while full < 60:  # many times round the ring
                limit.check(full)
                batch = client.poll_batch(timeout=10)
                if batch is None:
                    continue
                with batch:
                    full += len(batch) == 32
                    assert len(set(batch.sessions)) == len(batch)  # one chunk per session
                    for session, chunk in zip(batch.sessions, batch.chunks.tolist(), strict=True):
                        assert chunk == last.get(session, -1) + 1, session  # none lost
                        last[session] = chunk
            wrapped = client.transport.outbox.statistics()
            assert wrapped.bytes_pushed > 4 * wrapped.capacity  # it did go round
    finally:
        assert d.stop() == 0, d.stderr


@pytest.mark.usefixtures("each_path")
def test_a_steps_chunks_released_one_at_a_time_go_back_together(shm_prefix: str) -> None:
    # Issue 27: the per-chunk API pays per step: each release only counts, and the
    # step's rows go back in one call with its last (its released count says so).
    d = DaemonProcess(shm_prefix, "--model", "null", "--max-clients", "1")
    try:
        with d.client() as client:
            for name in ("a", "b", "c"):
                client.attach(name, credits=1)
            chunks = _one_step_by_chunk(client, 3)
            slab = client.transport.slot.slab  # the daemon's slab, as this client maps it
            before = slab.statistics().released
            chunks[0].release()
            chunks[1].release()
            assert client.held() == 1 and slab.statistics().released == before
            chunks[2].release()
            assert client.held() == 0 and slab.statistics().released == before + 3
    finally:
        assert d.stop() == 0, d.stderr


def test_a_new_client_in_a_used_slot_starts_with_clean_credit(shm_prefix: str) -> None:
    # Regression: a slot's consumed counts outlive its client; the next client's
    # unbound handles must not count as sessions with credit (every step failed).
    d = DaemonProcess(shm_prefix, "--model", "null", "--max-clients", "1")
    try:
        with d.client() as first:
            for name in ("a", "b", "c"):
                first.attach(name)
            for _ in range(5):
                _batch(first, 3).release()
        with d.client() as second:
            second.attach("z")
            assert [c.chunk for c in take(second, "z", 3)] == [0, 1, 2]
            assert not [n for n in second.notices() if "step failed" in n.message]
    finally:
        assert d.stop() == 0, d.stderr


def test_waiting_on_a_paced_daemon_with_nothing_coming_sleeps(shm_prefix: str) -> None:
    # Regression: around each tick the client spins at most briefly; a caller polling
    # once a period spun through the whole period when no record came (no credit left).
    d = DaemonProcess(shm_prefix, "--model", "null", "--pace-hz", "50")
    try:
        with d.client() as client:
            client.attach("a", credits=1)
            kept = client.poll_batch(timeout=10)  # held: nothing more will come
            assert kept is not None
            cpu, began = time.process_time(), time.monotonic()
            while time.monotonic() - began < 1.0:
                assert client.poll_batch(timeout=0.02) is None
            share = (time.process_time() - cpu) / (time.monotonic() - began)
            assert share < 0.10, f"waiting took {share:.0%} of a core"  # the budget
            kept.release()
    finally:
        assert d.stop() == 0, d.stderr


def test_delivery_latency_is_kept_for_inspect(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix, "--model", "null", "--pace-hz", "200")
    try:
        with d.client() as client:
            client.attach("a")
            control = client.transport.control  # the paced daemon publishes its next tick
            assert control.next_tick_ns > time.monotonic_ns() - 50_000_000
            for chunk in take(client, "a", 5):
                t = chunk.timing
                assert t.generated_ns <= t.emitted_ns <= t.pushed_ns <= t.taken_ns
            shown = subprocess.run(
                [sys.executable, "-m", "rte", "inspect", d.name, "--json"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            snap = json.loads(shown.stdout)
            assert sum(snap["emitted_to_pushed"]) >= 5
            (mine,) = snap["clients"]
            assert sum(mine["pushed_to_taken"]) >= 5
            text = subprocess.run(
                [sys.executable, "-m", "rte", "inspect", d.name],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            assert "emitted to pushed (daemon): p50 <=" in text
            assert "pushed to taken: p50 <=" in text
    finally:
        assert d.stop() == 0, d.stderr
