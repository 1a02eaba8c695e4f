"""A step's chunks travel through the daemon in one channel: the leases that hold them.

The daemon's serve loop returns, for each engine call, the slab leases its
allocator handed that call (:meth:`rte.ipc.allocator.SlabAllocator.emitted`,
the loop's ``emit``): each names the rows it holds (sessions, chunk indices),
whether its slots are one run (decided once, when they were leased), and when
its chunks were generated and emitted, so a STEP record is written from it
alone. Real engines over a real slab, in process (the daemon tests run them
behind the rings).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rte import ComposedEngine
from rte.contract import Notice, NoticeKind, ResultKind, StepResult, Timing
from rte.ipc.allocator import Lease, SlabAllocator
from rte.models import ReferenceModel
from rte.protocol.requests import Attach
from rte.replica import ReplicaEngine
from rte.serve import ServeLoop
from rte.stages import Batch
from shm import Segment, Slab, shm_name
from shm.segment import HEADER_SIZE

_CHUNK = ReferenceModel(1).manifest()  # what a step emits: a frame
SLOT_BYTES = int(np.prod(_CHUNK.latent_shape)) * np.dtype(_CHUNK.latent_dtype).itemsize


class _Owner:
    """A client as the allocator sees it: the slab owner its chunks are charged to."""

    def __init__(self, index: int) -> None:
        self.index = index


@pytest.fixture
def slab(shm_prefix: str) -> Iterator[Slab]:
    name = shm_name(shm_prefix, f"slab{uuid.uuid4().hex[:6]}")
    segment = Segment.create(name, HEADER_SIZE + Slab.footprint(HEADER_SIZE, 32, SLOT_BYTES, 2))
    try:
        yield Slab.create(segment, HEADER_SIZE, slots=32, slot_bytes=SLOT_BYTES, max_owners=2)
    finally:
        segment.close()
        segment.unlink()


def _loop(
    slab: Slab, make: Any, sessions: list[str]
) -> tuple[ServeLoop, SlabAllocator, list[list[StepResult]]]:
    """A daemon's serve loop (its chunks as leases) over the engine ``make(allocator)``,
    its sessions owned by client ``int(name[1:]) % 2``; and what each engine call returned."""
    owners: list[Any] = [_Owner(0), _Owner(1)]
    model = ReferenceModel(1)
    allocator = SlabAllocator(slab, model.manifest(), lambda s: owners[int(s[1:]) % 2])
    calls: list[list[StepResult]] = []

    def emit(results: list[StepResult]) -> tuple[list[Lease], int]:
        calls.append(results)
        return allocator.emitted(results)

    loop = ServeLoop(make(allocator), stamp=False, emit=emit, admission="rows")
    for session in sessions:
        assert [n.kind.name for n in loop.handle(Attach(session, {}))] == ["ATTACHED"]
    return loop, allocator, calls


def _leases(outcome: list[Any]) -> list[Lease]:
    assert all(type(item) is Lease for item in outcome), outcome  # chunks only, no notice
    return outcome


def test_a_step_returns_each_clients_chunks_as_one_lease_that_names_its_rows(
    slab: Slab,
) -> None:
    names = ["s0", "s1", "s2", "s3"]  # clients 0, 1, 0, 1: interleaved
    loop, _, calls = _loop(slab, lambda a: ComposedEngine(ReferenceModel(4), allocator=a), names)
    reference = ComposedEngine(ReferenceModel(4))
    for name in names:
        reference.attach(name, {})
    try:
        for _ in range(3):
            want = {r.session: r for r in reference.step(names) if r.has_chunk}
            leases = _leases(loop.step(names))
            got = {r.session: r for r in calls[-1] if r.has_chunk}
            if not want:  # pipelined: the first step only generates
                assert leases == []
                continue
            assert sorted(lease.owner.index for lease in leases) == [0, 1]
            for lease in leases:
                assert lease.sessions == [s for s in names if int(s[1:]) % 2 == lease.owner.index]
                assert lease.chunks == [want[s].chunk for s in lease.sessions]
                assert lease.loan.contiguous and lease.loan.block is not None  # a free run
                for session, row in zip(lease.sessions, lease.loan.rows, strict=True):
                    assert np.array_equal(row, want[session].latent), session
                    assert lease.emitted_ns == got[session].timing.emitted_ns
                    assert lease.generated_ns == got[session].timing.generated_ns
                lease.loan.abort()
    finally:
        loop.engine.close()
        reference.close()


def test_a_lease_of_a_whole_batch_carries_its_chunks_as_the_words_the_writer_reads(
    slab: Slab,
) -> None:
    """One client's whole batch: its chunk indices also as int64 words (the HOT
    batch's ages, read in place by the STEP record's writer), equal to its list."""
    names = ["s0", "s2", "s4"]  # all client 0's
    loop, _, _ = _loop(slab, lambda a: ComposedEngine(ReferenceModel(4), allocator=a), names)
    try:
        seen = 0
        for _ in range(4):
            for lease in _leases(loop.step(names)):
                words = lease.chunk_words
                assert words is not None and words.dtype == np.int64, words
                assert words.tolist() == lease.chunks and len(lease.chunks) == 3
                seen += 1
                lease.loan.abort()
        assert seen == 3  # (the first step only generates)
    finally:
        loop.engine.close()


def test_each_lease_carries_the_emission_time_of_its_own_engine(slab: Slab) -> None:
    # two engines of one row each: s0 (client 0) on the first, s1 (client 1) on the
    # second, which steps after the first returned: its chunk is emitted later, and
    # its STEP record must say so (it carried the first engine's time)
    def make(allocator: SlabAllocator) -> ReplicaEngine:
        return ReplicaEngine.of_model(lambda: ReferenceModel(1), 2, allocator=allocator)

    loop, _, calls = _loop(slab, make, ["s0", "s1"])
    try:
        loop.step(["s0", "s1"])
        leases = _leases(loop.step(["s0", "s1"]))
        emitted = {r.session: r.timing.emitted_ns for r in calls[-1]}
        assert emitted["s0"] < emitted["s1"]  # two engines, one after the other
        assert {lease.sessions[0]: lease.emitted_ns for lease in leases} == emitted
        for lease in leases:
            lease.loan.abort()
    finally:
        loop.engine.close()


def test_a_lease_that_matches_no_result_is_an_internal_error(slab: Slab) -> None:
    owners: list[Any] = [_Owner(0), _Owner(1)]
    manifest = ReferenceModel(1).manifest()
    allocator = SlabAllocator(slab, manifest, lambda s: owners[int(s[1:]) % 2])
    dtype, shape = np.dtype(manifest.latent_dtype), manifest.latent_shape
    leases = [  # two clients' leases, as two batches would leave them
        Lease(owners[i], slab.loan_batch(i, 1, dtype, shape), [f"s{i}"], [0], 1) for i in (0, 1)
    ]
    allocator.pending += leases
    only_s0 = [StepResult("s0", 0, ResultKind.CHUNK, None, Timing(1, 5))]  # none for s1
    try:
        with pytest.raises(RuntimeError, match=r"lease of sessions \['s1'\] does not match"):
            allocator.emitted(only_s0)  # it was stamped with now, unchecked
    finally:
        for lease in leases:
            lease.loan.abort()


def test_a_refused_action_among_chunks_still_becomes_its_error_notice(slab: Slab) -> None:
    # the loop's emit says how many chunks its leases hold; fewer than the results
    # means some carry none: the refused action's ERROR must still be told
    names = ["s0", "s1", "s2", "s3"]
    loop, allocator, calls = _loop(
        slab, lambda a: ComposedEngine(ReferenceModel(4), allocator=a), names
    )
    try:
        for lease in _leases(loop.step(names)):
            lease.loan.abort()
        # an action the loop could not check ahead (a parked session's is checked at
        # its step) reaches the engine, which refuses it there
        loop.pending.put("s1", {"prompt": 42}, 7)
        outcome = loop.step(names)
        leases = [item for item in outcome if type(item) is Lease]
        notices = [item for item in outcome if isinstance(item, Notice)]
        assert sorted(s for lease in leases for s in lease.sessions) == ["s0", "s2", "s3"]
        assert [(n.session, n.kind) for n in notices] == [("s1", NoticeKind.ERROR)]
        assert "prompt must be a str" in notices[0].message
        assert {r.session: r.kind for r in calls[-1]}["s1"] is ResultKind.ERROR
        for lease in leases:
            lease.loan.abort()
        assert allocator.emitted(calls[-1]) == ([], 0)  # taken: nothing left to emit
    finally:
        loop.engine.close()


def test_a_batch_of_the_same_sessions_is_grouped_anew_once_an_owner_changed(slab: Slab) -> None:
    # the allocator keeps the last list's grouping by owner while the owners'
    # version stays; a session that changed owner must be leased to its new one
    owners: list[Any] = [_Owner(0), _Owner(1)]
    of = {"s0": owners[0], "s1": owners[0]}
    version = [0]
    manifest = ReferenceModel(1).manifest()
    allocator = SlabAllocator(slab, manifest, of.__getitem__, lambda: version[0])
    sessions = ["s0", "s1"]

    def lease_owners() -> list[tuple[int, list[str]]]:
        batch = Batch([0, 1], sessions, [0, 0], [{}, {}])
        allocator.allocate(batch)
        leases = allocator.take()
        for lease in leases:
            lease.loan.abort()
        return [(lease.owner.index, lease.sessions) for lease in leases]

    assert lease_owners() == [(0, ["s0", "s1"])]
    assert lease_owners() == [(0, ["s0", "s1"])]  # (the same list: the cached grouping)
    of["s1"] = owners[1]
    version[0] += 1
    assert lease_owners() == [(0, ["s0"]), (1, ["s1"])]
