"""Defects of the GPU path found by reading it against CUDA's and torch's rules
(issue 26), each shown here on the CPU: a stand-in for what the GPU would do,
the real slab, or the model on torch's CPU device. The GPU halves are marked."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rte import ComposedEngine
from rte.lanes import Lane

torch = pytest.importorskip("torch", reason="needs the torch extra: pip install -e '.[torch]'")

from rte.lanes.torch import PinnedHeap, lane_priorities, wait_for  # noqa: E402
from rte.models.graphs import GraphSet  # noqa: E402
from rte.models.world import TorchWorldModel  # noqa: E402

# -- 1. a failed capture restores the current stream --------------------------------


class _Stream:
    def __init__(self, name: str) -> None:
        self.name = name

    def wait_stream(self, other: object) -> None:
        return None


class _CaptureFails:
    """torch.cuda as a capture that fails sees it: ``graph.__exit__`` raises from
    ``capture_end`` before it restores the stream it made current."""

    def __init__(self) -> None:
        self.current = _Stream("the lane's stream")

    def Stream(self) -> _Stream:
        return _Stream("the side stream")

    def CUDAGraph(self) -> object:
        return object()

    def graph_pool_handle(self) -> object:
        return object()

    def current_stream(self) -> _Stream:
        return self.current

    def set_stream(self, stream: _Stream) -> None:
        self.current = stream

    def stream(self, stream: _Stream) -> Any:
        return _Current(self, stream, restores=True)

    def graph(self, graph: object, *, stream: _Stream, **kwargs: object) -> Any:
        return _Current(self, stream, restores=False)


class _Current:
    """A context that makes ``stream`` current; a capture's raises on exit instead."""

    def __init__(self, cuda: _CaptureFails, stream: _Stream, *, restores: bool) -> None:
        self.cuda, self.stream, self.restores = cuda, stream, restores

    def __enter__(self) -> None:
        self.before, self.cuda.current = self.cuda.current, self.stream

    def __exit__(self, *exc: object) -> None:
        if not self.restores:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.cuda.current = self.before


def test_a_failed_capture_leaves_the_current_stream_as_it_was() -> None:
    cuda = _CaptureFails()
    lane = cuda.current
    graphs = GraphSet(lambda x: x, lambda size: (torch.zeros(size),), [1, 2], cuda=cuda)
    assert not graphs.capture() and "capturing" in (graphs.failed or "")
    assert cuda.current is lane  # not the side stream: the eager fallback runs on HOT
    assert graphs.inputs(1) is None  # and the caller runs eagerly


def test_every_graph_size_is_one_at_the_arena_when_batch_invariant() -> None:
    model = TorchWorldModel(64, device="cpu", batch_invariant=True)
    assert model.hot_graphs.sizes == [64]  # one capture per lane, not 7
    assert TorchWorldModel(64, device="cpu", batch_invariant=False).hot_graphs.sizes == list(
        range(1, 65)
    )  # the CPU runs unpadded


# -- 4. padded to one size, a row computes alike solo and batched --------------------


def test_padding_to_the_arena_changes_no_frame() -> None:
    def frames(invariant: bool, names: list[str]) -> dict[tuple[str, int], Any]:
        engine = ComposedEngine(TorchWorldModel(8, device="cpu", batch_invariant=invariant))
        for name in names:
            engine.attach(name, {"prompt": name})
        out = {}
        for _ in range(5):
            out.update(
                {
                    (r.session, r.chunk): np.array(r.latent)
                    for r in engine.step(names)
                    if r.has_chunk
                }
            )
        engine.close()
        return out

    plain, padded = frames(False, ["a", "b", "c"]), frames(True, ["a", "b", "c"])
    solo = frames(True, ["b"])
    assert plain.keys() == padded.keys() and len(plain) >= 12
    for key, frame in plain.items():
        assert np.array_equal(frame, padded[key]), key
    for key, frame in solo.items():
        assert np.array_equal(frame, padded[key]), key


# -- 5. the host's wait blocks on the event, never naps --------------------------------


class _Event:
    def __init__(self, done_after: int | None) -> None:
        self.queries, self.done_after, self.synchronized = 0, done_after, False

    def query(self) -> bool:
        self.queries += 1
        return self.done_after is not None and self.queries > self.done_after

    def synchronize(self) -> None:
        self.synchronized = True


def test_a_host_wait_spins_briefly_then_blocks_on_the_event() -> None:
    soon = _Event(done_after=3)
    # a spin long enough that a preempted test thread still sees the event done in it
    # (the default's tens of microseconds ran out before the 4th query in a CI run)
    wait_for(soon, 10.0)
    assert not soon.synchronized  # done while spinning: no driver wait
    late = _Event(done_after=None)  # done only for a blocking wait
    waiter = threading.Thread(target=wait_for, args=(late, 1e-4), daemon=True)
    waiter.start()
    waiter.join(5)
    assert not waiter.is_alive() and late.synchronized


# -- 6. priorities follow the critical path --------------------------------------------


def test_stream_priorities_are_hot_then_deferred_then_encode() -> None:
    p = lane_priorities(0, -5)  # lower is sooner
    assert p[Lane.HOT] < p[Lane.DEFERRED] < p[Lane.ENCODE] == 0
    two = lane_priorities(0, -1)  # a device with two levels: ENCODE still last
    assert two[Lane.HOT] == two[Lane.DEFERRED] == -1 and two[Lane.ENCODE] == 0


# -- 7. in-process outputs come from a bounded, reused pool ----------------------------


def test_pinned_outputs_are_reused_once_dropped_and_never_grow_past_the_bound() -> None:
    manifest = TorchWorldModel(4, device="cpu").manifest()
    heap = PinnedHeap(manifest, blocks=2, pinned=False)  # the pool's logic; pinning needs CUDA
    from rte.stages import Batch  # noqa: PLC0415

    def batch() -> Batch:
        return Batch([0, 1], ["a", "b"], [0, 0], [{}, {}])

    first = heap.allocate(batch())
    address = first[0].ctypes.data
    del first
    again = heap.allocate(batch())
    assert again[0].ctypes.data == address and heap.made == 1  # reused: no new cudaHostAlloc
    kept = [heap.allocate(batch()) for _ in range(5)]  # a consumer that keeps its frames
    addresses = {k[0].ctypes.data for k in [again, *kept]}
    assert len(addresses) == 6  # nothing it holds is handed out twice
    assert len(heap._blocks) == 2  # the pool stays at its bound


# -- 2, 3. the slab: one copy per client, slots not page-rounded ------------------------


@pytest.fixture
def slab(shm_prefix: str) -> Iterator[Any]:
    from shm import Segment, Slab, shm_name  # noqa: PLC0415
    from shm.segment import HEADER_SIZE  # noqa: PLC0415

    name = shm_name(shm_prefix, f"slab{uuid.uuid4().hex[:6]}")
    segment = Segment.create(name, HEADER_SIZE + Slab.footprint(HEADER_SIZE, 32, 3072, 2))
    try:
        yield Slab.create(segment, HEADER_SIZE, slots=32, slot_bytes=3072, max_owners=2)
    finally:
        segment.close()
        segment.unlink()


def test_a_3_kib_frame_takes_a_3_kib_slot(slab: Any) -> None:
    assert slab.slot_size == 3072  # was 4096: 75% of the link's rate at most
    loan = slab.loan_batch(0, 4, np.uint8, (32, 32, 3))
    assert loan.block is not None and loan.block.strides[0] == loan.block[0].nbytes
    loan.abort()


class _Owner:
    def __init__(self, index: int) -> None:
        self.index = index


def test_a_batch_of_two_clients_is_one_copy_per_client(slab: Any) -> None:
    from rte.ipc.allocator import SlabAllocator  # noqa: PLC0415

    model = TorchWorldModel(4, device="cpu")
    owners: list[Any] = [_Owner(0), _Owner(1)]
    allocator = SlabAllocator(slab, model.manifest(), lambda s: owners[int(s[1:]) % 2])
    engine = ComposedEngine(model, lanes="cpu", allocator=allocator)
    reference = ComposedEngine(TorchWorldModel(4, device="cpu"), lanes="cpu")
    names = ["s0", "s1", "s2", "s3"]  # clients 0, 1, 0, 1: interleaved
    for name in names:
        engine.attach(name, {"prompt": name})
        reference.attach(name, {"prompt": name})
    for _ in range(4):
        before = model.out.copies
        got = {r.session: np.array(r.latent) for r in engine.step(names) if r.has_chunk}
        want = {r.session: r.latent for r in reference.step(names) if r.has_chunk}
        if got:
            assert model.out.copies - before == 2  # one per client, not one per frame
        for session, frame in want.items():
            assert np.array_equal(got[session], frame), session
        for lease in allocator.take():
            lease.loan.abort()
    engine.close()
    reference.close()
    for lease in allocator.take():
        lease.loan.abort()


# -- the GPU halves ----------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_a_capture_that_fails_on_a_gpu_restores_the_stream() -> None:
    lane = torch.cuda.Stream()

    def syncs(x: Any) -> Any:
        return x * float(x.sum())  # .item() inside a capture: the capture fails

    with torch.cuda.stream(lane):
        graphs = GraphSet(syncs, lambda size: (torch.ones(size, device="cuda"),), [1])
        assert not graphs.capture()
        assert torch.cuda.current_stream() == lane


@pytest.mark.gpu
@cuda
def test_lanes_of_many_engines_never_share_a_stream() -> None:
    from rte.lanes import make_lanes  # noqa: PLC0415

    lanes = [make_lanes("cuda", "cuda:0") for _ in range(12)]  # 36 streams, past the pool
    streams = {
        lane.backend.stream(kind).cuda_stream  # type: ignore[attr-defined]
        for lane in lanes
        for kind in Lane
    }
    assert len(streams) == 36
    for lane in lanes:
        lane.close()


@pytest.mark.gpu
@cuda
def test_encode_on_real_streams_a_prompt_changed_mid_run_and_an_encode_that_fails() -> None:
    """Issue 26 defect 10: ENCODE was never exercised on real streams. gpu_check's
    encode section: the changed row rejoins with its prompt, a failing encode fails
    its session alone, the bystanders equal to 0 levels and lose no chunk."""
    from tools.gpu_check import Check  # noqa: PLC0415
    from tools.gpu_sections import encode  # noqa: PLC0415

    report = encode(Check(torch, simulate=False))
    assert report["ok"], report
