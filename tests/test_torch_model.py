"""The torch world model behind ComposedEngine: the engine's behaviours on real
tensor work (CPU here; the GPU checks are marked and skipped without CUDA)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from child_python import python_c

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams


torch = pytest.importorskip("torch", reason="needs the torch extra: pip install -e '.[torch]'")

from daemon_harness import DaemonProcess, mapped_file, slab_file  # noqa: E402

from rte import Action, ComposedEngine, ResultKind  # noqa: E402
from rte.lanes import Lane  # noqa: E402
from rte.models import load_model  # noqa: E402
from rte.models.world import TorchWorldModel  # noqa: E402


def stream(
    sessions: list[str], steps: int, *, pipelined: bool = True, change: str | None = None
) -> dict[str, dict[int, np.ndarray[Any, Any]]]:
    engine = ComposedEngine(TorchWorldModel(8, pipelined=pipelined, device="cpu"))
    for s in sessions:
        engine.attach(s, {"prompt": f"prompt of {s}"})
    out: dict[str, dict[int, np.ndarray[Any, Any]]] = {s: {} for s in sessions}
    for i in range(steps):
        actions = {s: Action({"move": (i % 3 - 1, 1)}) for s in sessions if i % 2}
        if change in sessions and i == 2:
            actions[change] = Action({"prompt": "a changed world"})
        for r in engine.step(sessions, actions):
            if r.has_chunk:
                assert r.chunk not in out[r.session]
                out[r.session][r.chunk] = r.latent.copy()
        engine.lanes.drain()
    engine.close()
    return out


def test_solo_and_batched_are_bit_identical_on_the_cpu_and_sessions_differ() -> None:
    names = [f"s{i}" for i in range(6)]
    batched = stream(names, 8, change="s5")  # a bystander's encode changes nothing here
    for s in ("s0", "s3"):
        solo = stream([s], 8)
        assert solo[s].keys() == batched[s].keys() and len(solo[s]) >= 6
        for chunk, latent in solo[s].items():
            assert np.array_equal(latent, batched[s][chunk]), (s, chunk)
    assert not np.array_equal(batched["s0"][4], batched["s1"][4])
    assert batched["s0"][4].shape == (32, 32, 3) and batched["s0"][4].dtype == np.uint8


def test_deferred_lags_hot_by_exactly_one_chunk() -> None:
    piped = stream(["a"], 7)
    flat = stream(["a"], 6, pipelined=False)
    assert sorted(piped["a"]) == sorted(flat["a"]) == list(range(6))
    for chunk, latent in flat["a"].items():
        np.testing.assert_array_equal(piped["a"][chunk], latent)


def test_the_kv_cache_makes_the_stream_causal() -> None:
    """A move at chunk 1 still shows at chunk 3, when both runs send no move: the
    difference can only travel through the row's own KV cache."""

    def run(kick: bool) -> list[np.ndarray[Any, Any]]:
        engine = ComposedEngine(TorchWorldModel(2, pipelined=False, device="cpu"))
        engine.attach("a")
        frames = []
        for i in range(4):
            move = (3, 3) if kick and i == 1 else (0, 0)
            (r,) = engine.step(["a"], {"a": Action({"move": move})})
            frames.append(r.latent.copy())
        engine.close()
        return frames

    plain, kicked = run(False), run(True)
    assert np.array_equal(plain[0], kicked[0])
    assert not np.array_equal(plain[1], kicked[1])
    assert not np.array_equal(plain[3], kicked[3])


def test_heavy_prompt_changes_encode_once_and_the_row_sits_out() -> None:
    model = TorchWorldModel(4, device="cpu")
    engine = ComposedEngine(model)
    engine.attach("a", {"prompt": "one"})
    engine.attach("b", {"prompt": "two"})
    engine.step(["a", "b"])
    gate = threading.Event()
    inner = model._encode_prompt

    def slow(batch: Any) -> None:
        assert gate.wait(30)
        inner(batch)

    engine._encode[0] = engine._encode[0].__class__("encode_prompt", Lane.ENCODE, slow)
    kinds = []
    for _ in range(3):
        by = {r.session: r for r in engine.step(["a", "b"], {"a": Action({"prompt": "three"})})}
        kinds.append(by["a"].kind)
        assert by["b"].kind is ResultKind.CHUNK
    assert kinds[-1] is ResultKind.ENCODING
    gate.set()
    engine.lanes.drain()
    deadline = time.monotonic() + 10
    while {r.session: r for r in engine.step(["a", "b"])}["a"].kind is not ResultKind.WARMUP:
        assert time.monotonic() < deadline
    assert model.encodes == [("a", "three")]
    engine.close()


def test_a_failing_stage_discards_in_flight_output_and_the_engine_recovers() -> None:
    model = TorchWorldModel(2, device="cpu")
    broken = {"once": True}
    decode = model._decode

    def flaky(batch: Any) -> None:
        if broken.pop("once", False):
            raise RuntimeError("decoder fell over")
        decode(batch)

    model._decode = flaky  # type: ignore[method-assign]
    engine = ComposedEngine(model)
    engine.attach("a")
    engine.step(["a"])
    with pytest.raises(RuntimeError, match="decoder fell over"):
        engine.step(["a"])
    seen = [r.chunk for _ in range(4) for r in engine.step(["a"]) if r.has_chunk]
    assert seen == sorted(set(seen)) and seen[0] > 0  # never twice, never stale
    engine.close()


# What a GPU would launch, counted on the CPU: every op torch dispatches, less views
# and metadata (which launch nothing), attributed to the lane it ran on.
NO_LAUNCH = {
    *("view", "_unsafe_view", "transpose", "t", "split", "select", "slice", "unsqueeze"),
    *("expand", "permute", "alias", "detach", "split_with_sizes", "as_strided", "squeeze"),
    *("lift_fresh", "_reshape_alias", "unbind", "resolve_conj", "resolve_neg", "flatten"),
}
# Measured with this counter on the per-row model this replaced (64 sessions, one step).
PER_ROW_HOT, PER_ROW_STEP = 683, 762


def launches_per_step(sessions: int) -> dict[str, int]:
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC0415

    engine = ComposedEngine(TorchWorldModel(sessions, device="cpu"), lanes="cpu")
    counts = {"hot": 0, "deferred": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = func.overloadpacket.__name__
            if name not in NO_LAUNCH or name == "reshape":  # a reshape may copy: count it
                lane = engine.lanes.current
                assert lane is not None, f"{name} ran outside a lane"
                counts[lane.value] += 1
            return func(*args, **(kwargs or {}))

    names = [f"s{i}" for i in range(sessions)]
    for name in names:
        engine.attach(name, {"prompt": name})
    for i in range(6):  # past the window: the KV ring has wrapped
        engine.step(names, {s: Action({"move": (i % 3 - 1, 1)}) for s in names})
    with Count():
        engine.step(names, {s: Action({"move": (1, 0)}) for s in names})
    engine.close()
    return counts


def test_a_step_launches_the_same_few_kernels_whatever_the_batch() -> None:
    at64 = launches_per_step(64)
    assert at64 == launches_per_step(1)  # no op per row: the batch is one set of launches
    assert at64["hot"] * 10 <= PER_ROW_HOT, at64
    assert sum(at64.values()) * 10 <= PER_ROW_STEP, at64


@pytest.fixture
def torch_daemon(shm_prefix: str) -> Iterator[DaemonProcess]:
    d = DaemonProcess(shm_prefix, "--model", "torch", "--max-sessions", "2")
    yield d
    assert d.stop() == 0, d.stderr


def test_the_daemon_serves_it_and_chunks_are_the_slab_memory(torch_daemon: DaemonProcess) -> None:
    with torch_daemon.client(timeout=60) as client:
        assert client.manifest.model == "torch"
        client.attach("w", {"prompt": "a torch world"})
        got = []
        while len(got) < 5:
            chunk = client.poll(timeout=30)
            assert chunk is not None
            with chunk:
                address = chunk.latent.__array_interface__["data"][0]
                assert mapped_file(address) == slab_file(torch_daemon.name)
                got.append(chunk.chunk)
        assert got == list(range(5))


def test_selecting_it_without_torch_says_how_to_install_it() -> None:
    code = (
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "from rte.models import load_model\n"
        "try:\n"
        "    load_model('torch')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = python_c(code)
    assert "pip install -e '.[torch]'" in done.stdout, done.stderr


def test_load_model_builds_it_by_short_name() -> None:
    model = load_model("torch", max_sessions=3)
    assert isinstance(model, TorchWorldModel) and model.manifest().max_sessions == 3


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_gpu_matches_cpu_within_tolerance() -> None:
    cpu = stream(["a", "b"], 5)
    engine = ComposedEngine(TorchWorldModel(8, device="cuda"))
    assert engine.lanes.kind == "cuda"
    for s in ("a", "b"):
        engine.attach(s, {"prompt": f"prompt of {s}"})
    gpu: dict[str, dict[int, np.ndarray[Any, Any]]] = {"a": {}, "b": {}}
    for i in range(5):
        actions = {s: Action({"move": (i % 3 - 1, 1)}) for s in ("a", "b") if i % 2}
        for r in engine.step(["a", "b"], actions):
            if r.has_chunk:
                gpu[r.session][r.chunk] = r.latent.copy()
    engine.close()
    for s in ("a", "b"):
        for chunk, latent in cpu[s].items():
            diff = np.abs(latent.astype(int) - gpu[s][chunk].astype(int))
            assert diff.max() <= 2, (s, chunk, diff.max())  # uint8 frames: within 2 levels


@pytest.mark.gpu
@cuda
def test_device_to_slab_copy_is_asynchronous_to_the_hot_stream() -> None:
    """A big device-to-slab copy queued on DEFERRED does not hold back HOT work
    queued after it (issue 26 defect 10: the copy went into ``pin_memory()``, not a
    registered slab, and HOT allocated during it: an implicit synchronization).
    The slab is page-locked through shm/cuda.py (``Slab.pin``); every tensor,
    stream and event is made before the copy, and HOT works in place."""
    from shm import Segment, Slab, shm_name  # noqa: PLC0415
    from shm.segment import HEADER_SIZE  # noqa: PLC0415

    size = 256 << 20
    name = shm_name(f"copyoverlap{uuid.uuid4().hex[:8]}", "slab")
    segment = Segment.create(name, HEADER_SIZE + Slab.footprint(HEADER_SIZE, 1, size, 1))
    try:
        slab = Slab.create(segment, HEADER_SIZE, slots=1, slot_bytes=size, max_owners=1)
        assert slab.pin()  # cudaHostRegister through shm/cuda.py
        try:
            with slab.loan(0, np.uint8, (size,)) as loan:  # never published: aborted
                host = torch.from_numpy(loan.array)
                assert host.is_pinned()
                device = torch.empty(size, dtype=torch.uint8, device="cuda")
                x = torch.ones(1024, device="cuda")
                deferred, hot = torch.cuda.Stream(), torch.cuda.Stream()
                copied, done = torch.cuda.Event(), torch.cuda.Event()
                torch.cuda.synchronize()
                with torch.cuda.stream(deferred):
                    host.copy_(device, non_blocking=True)
                    copied.record(deferred)
                with torch.cuda.stream(hot):
                    x.mul_(2)  # in place: no allocation on HOT during the copy
                    done.record(hot)
                done.synchronize()
                assert not copied.query()  # HOT finished while the copy was still running
                copied.synchronize()
                assert float(x.sum()) == 2048.0
        finally:
            slab.unpin()
    finally:
        segment.close()
        segment.unlink()


@pytest.mark.gpu
@cuda
def test_cuda_graphs_give_the_eager_frames_and_the_step_never_syncs() -> None:
    def run(graphs: bool) -> tuple[dict[tuple[str, int], np.ndarray[Any, Any]], Any]:
        model = TorchWorldModel(8, device="cuda", graphs=graphs)
        engine = ComposedEngine(model)  # its outputs page-locked, as the slab is
        names = [f"s{i}" for i in range(5)]  # a padded size: 5 rows in a graph of 8
        for s in names:
            engine.attach(s, {"prompt": f"prompt of {s}"})
        out = {}
        for i in range(8):
            if i == 4:
                torch.cuda.set_sync_debug_mode("error")  # steady state: no host sync at all
            try:
                results = engine.step(names, {s: Action({"move": (i % 3 - 1, 1)}) for s in names})
            finally:
                torch.cuda.set_sync_debug_mode("default")
            out.update({(r.session, r.chunk): r.latent.copy() for r in results if r.has_chunk})
        engine.close()
        return out, model

    eager, _ = run(False)
    graphed, model = run(True)
    assert model.hot_graphs.failed is None and model.decode_graphs.failed is None
    assert eager.keys() == graphed.keys()
    for key, frame in eager.items():
        assert np.abs(frame.astype(int) - graphed[key].astype(int)).max() <= 2, key


def test_the_state_digest_is_the_weights_it_always_was() -> None:
    """States saved before the network became its own module (rte.models.world_net)
    still resume: the same weights, drawn in the same order, hashed in the same order."""
    identity = TorchWorldModel(2, device="cpu").state_identity()
    assert identity.name == "torch" and identity.version == 1
    assert identity.digest == "cf2e26e9e8fe4d3cdac05d843b231153"
