"""The CUDA lanes, proven without a GPU: the engine on the simulated device.

:mod:`rte.lanes.sim` runs the lanes' streams and events on the CPU and raises a
hazard for every touch that no event orders (vector clocks, checked at each
launch and each read of a batch's carry), so each test here fails on the
ordering mistake it names, every time. The whole engine, serve and daemon
suites also run on it (the ``each_lanes`` fixture).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest
from daemon_harness import DaemonProcess, Deadline, leftovers
from faulty_model import FAULT_AT

from probe_model import InjectedFailure, ProbeModel
from rte import Action, ComposedEngine, EngineFault, EngineGone, HeapAllocator, ResultKind
from rte.lanes import CudaLanes, Lane, make_lanes
from rte.lanes.sim import DeviceFault, HazardError, SimCuda, SimCudaError
from rte.models import ReferenceModel
from rte.stages import Batch


def sim_engine(max_sessions: int = 4, **kwargs: Any) -> tuple[ComposedEngine, ProbeModel, SimCuda]:
    model = ProbeModel(max_sessions, **kwargs)
    device = SimCuda()
    engine = model.bind(ComposedEngine(model, lanes=CudaLanes(device)))
    return engine, model, device


def steps(engine: ComposedEngine, due: list[str], n: int) -> list[Any]:
    return [r for _ in range(n) for r in engine.step(due)]


# -- the simulated device finds what a GPU would get wrong only sometimes ------


def test_a_read_of_hot_output_without_an_event_wait_is_a_hazard() -> None:
    device = SimCuda()
    hot, deferred = device.stream(Lane.HOT), device.stream(Lane.DEFERRED)
    batch = Batch([0], ["a"], [0], [{}])
    device.launch(hot, lambda b: b.carry.update(latent=1), batch)
    with pytest.raises(HazardError, match="carry"):
        device.launch(deferred, lambda b: b.carry["latent"], batch)  # no wait: a race
    with pytest.raises(HazardError, match="host code"):
        batch.carry.items()  # nor may the host read it before waiting
    made = device.record(hot)
    device.wait(deferred, made)
    device.launch(deferred, lambda b: b.carry["latent"], batch)  # ordered: fine
    device.host_wait(made)
    assert batch.carry["latent"] == 1


def test_two_streams_writing_one_row_unordered_is_a_hazard() -> None:
    device = SimCuda()
    hot, encode = device.stream(Lane.HOT), device.stream(Lane.ENCODE)
    device.launch(hot, lambda _: None, Batch([2], ["a"], [0], [{}]))
    with pytest.raises(HazardError, match="row 2"):
        device.launch(encode, lambda _: None, Batch([2], ["a"], [0], [{}]))
    device.launch(encode, lambda _: None, Batch([3], ["b"], [0], [{}]))  # another row: fine


def test_a_device_fault_sticks() -> None:
    device = SimCuda()
    hot = device.stream(Lane.HOT)

    def broken(_: object) -> None:
        raise DeviceFault("an illegal memory access was encountered")

    with pytest.raises(SimCudaError, match="illegal memory access"):
        device.launch(hot, broken, None)
    for call in (lambda: device.synchronize(hot), lambda: device.record(hot)):
        with pytest.raises(SimCudaError):
            call()


# -- 2. lanes follow the model's device -----------------------------------------


def test_lanes_follow_the_models_device_not_what_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU box
    monkeypatch.delenv("RTE_LANES", raising=False)
    assert ComposedEngine(ReferenceModel(2)).lanes.kind == "cpu"
    lanes = make_lanes("auto", "cuda:1")  # "one daemon per GPU": the index is honoured
    assert isinstance(lanes, CudaLanes) and lanes.backend.name == "cuda:1"
    assert make_lanes("auto", "cpu").kind == "cpu"


# -- 1. an encode that fails, on CUDA lanes ---------------------------------------


def test_a_failing_encode_fails_its_session_on_the_encode_worker_and_the_rest_go_on() -> None:
    engine, model, _ = sim_engine()
    engine.attach("a", {"prompt": "one"})
    engine.attach("b")
    steps(engine, ["a", "b"], 2)
    model.fail["encode_prompt"] = InjectedFailure("a bad prompt")
    engine.step(["a", "b"], {"a": Action({"prompt": "two"})})
    kinds, made = [], []
    for _ in range(8):  # no step fails: the failure is a's alone, and a is FAILED
        for r in engine.step(["a", "b"]):
            if r.session == "a":
                kinds.append(r.kind)
            elif r.has_chunk:
                made.append(r.chunk)
    assert ResultKind.FAILED in kinds and kinds[-1] is ResultKind.FAILED
    assert made == list(range(2, 10))  # b: every chunk, none lost to a's failure
    threads = [c.thread for c in model.calls if c.name == "encode_prompt"]
    assert threads and all(name.startswith("rte-encode") for name in threads)
    engine.close()


# -- 3. a partial decode takes HOT's output on DEFERRED, after HOT's event -----------


def test_a_partial_decode_reads_hot_output_after_hot() -> None:
    engine, _, _ = sim_engine()
    for s in "abc":
        engine.attach(s)
    steps(engine, ["a", "b", "c"], 3)
    (late,) = [r for r in engine.step(["a"]) if r.has_chunk]  # a subset of last step's batch
    assert late.session == "a"
    rest = engine.finalize(["b", "c"])  # and the rest of it, at a detach/reset
    assert sorted(r.session for r in rest) == ["b", "c"]
    engine.close()


# -- 4. close waits for the lanes -------------------------------------------------


def test_close_waits_for_an_encode_in_flight() -> None:
    engine, model, _ = sim_engine()
    engine.attach("a", {"prompt": "one"})
    steps(engine, ["a"], 2)
    model.encode_gate = threading.Event()
    engine.step(["a"], {"a": Action({"prompt": "two"})})  # held at the gate
    closer = threading.Thread(target=engine.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # still waiting for the encode
    model.encode_gate.set()
    closer.join(10)
    assert not closer.is_alive() and model.encodes[-1] == ("a", "two")


# -- 7. ENCODE rewrites a row only after HOT work queued before it ---------------------


def test_an_encode_is_ordered_after_the_hot_work_that_reads_its_row() -> None:
    engine, model, _ = sim_engine()
    engine.attach("a", {"prompt": "one"})
    engine.attach("b")
    steps(engine, ["a", "b"], 2)  # HOT work that reads a's row is queued
    engine.step(["a", "b"], {"a": Action({"prompt": "two"})})
    engine.lanes.drain()
    results = steps(engine, ["a", "b"], 3)
    assert model.encodes == [("a", "two")]
    assert {r.session for r in results if r.has_chunk} == {"a", "b"}
    engine.close()


# -- 8. a session that leaves stalls nobody ---------------------------------------------


def test_a_detach_waits_for_no_stream_and_the_others_lose_nothing() -> None:
    """Issue 26 defect 8: every detach synchronized every stream, twice (before and
    after the model's detach): a stall of the whole cohort on every leave."""
    engine, model, device = sim_engine()
    for s in "abc":
        engine.attach(s, {"prompt": "p"})
    steps(engine, ["a", "b", "c"], 3)
    engine.step(["a", "b", "c"], {"c": Action({"prompt": "q"})})  # an ENCODE stream too
    engine.lanes.drain()
    last = {r.session: r.chunk for r in steps(engine, ["a", "b", "c"], 2) if r.has_chunk}
    waits = device.host_waits
    engine.detach("b")
    assert device.host_waits == waits  # the host waited for no event and no stream
    (forgot,) = [c for c in model.calls if c.name == "detach"]
    assert forgot.rows == (1,) and forgot.lane is Lane.HOT
    made = [(r.session, r.chunk) for r in steps(engine, ["a", "c"], 2) if r.has_chunk]
    a, c = last["a"], last["c"]
    assert made == [("a", a + 1), ("c", c + 1), ("a", a + 2), ("c", c + 2)]  # none lost
    engine.close()


def test_a_detach_while_its_encode_runs_forgets_the_row_after_the_encode() -> None:
    """Its row is rewritten by the encode under way: the model's detach (on HOT) runs
    after it, never beside it (the simulated device would see the race)."""
    engine, model, _ = sim_engine()
    engine.attach("a", {"prompt": "one"})
    engine.attach("b")
    steps(engine, ["a", "b"], 2)
    model.encode_gate = threading.Event()
    engine.step(["a", "b"], {"a": Action({"prompt": "two"})})  # held at the gate
    failures: list[BaseException] = []

    def detach() -> None:
        try:
            engine.detach("a")
        except BaseException as exc:  # a race the device saw: HazardError
            failures.append(exc)

    leaving = threading.Thread(target=detach)
    leaving.start()
    leaving.join(0.3)
    assert leaving.is_alive()  # waiting for a's encode, not forgetting its row under it
    model.encode_gate.set()
    leaving.join(10)
    assert not leaving.is_alive() and failures == [] and engine.sessions() == {"b": 1}
    assert model.encodes[-1] == ("a", "two") and model.names()[-1] == "detach"
    made = [r.chunk for r in steps(engine, ["b"], 2) if r.has_chunk]
    assert made == [2, 3]
    engine.close()


# -- 9. what the model's construction wrote is complete before HOT reads it -------------


def test_model_initialisation_is_settled_before_the_first_step() -> None:
    device = SimCuda()
    model = ReferenceModel(2)
    everything = Batch([0, 1], ["", ""], [0, 0], [{}, {}])
    device.launch(device.default, lambda _: None, everything)  # zero fills, another stream
    engine = ComposedEngine(model, lanes=CudaLanes(device))
    engine.attach("a")
    assert steps(engine, ["a"], 3)  # no hazard: the lanes settled the device first
    engine.close()


# -- 10. a sticky device error fails the engine closed ------------------------------------


class Leases(HeapAllocator):
    def __init__(self, model: ReferenceModel) -> None:
        super().__init__(model.manifest())
        self.out = 0

    def allocate(self, batch: Batch) -> list[np.ndarray[Any, Any]]:
        self.out += len(batch.rows)
        return super().allocate(batch)

    def discard(self, batch: Batch, buffers: list[np.ndarray[Any, Any]]) -> None:
        self.out -= len(buffers)


def test_a_sticky_device_error_fails_the_engine_closed_and_gives_back_every_buffer() -> None:
    model = ProbeModel(2)
    leases = Leases(model)
    engine = ComposedEngine(model, lanes=CudaLanes(SimCuda()), allocator=leases)
    engine.attach("a")
    emitted = 0
    for _ in range(3):
        emitted += sum(r.has_chunk for r in engine.step(["a"]))
    model.fail["denoise"] = DeviceFault("an illegal memory access was encountered")
    with pytest.raises(EngineFault, match="illegal memory access") as caught:
        engine.step(["a"])
    assert isinstance(caught.value.__cause__.__cause__, SimCudaError)  # type: ignore[union-attr]
    assert leases.out == emitted  # the in-flight output was given back, nothing is WRITING
    for call in (lambda: engine.step(["a"]), lambda: engine.attach("b")):
        with pytest.raises(EngineFault):
            call()
    engine.close()  # and closing it is quiet


def test_a_daemon_whose_device_fails_closes_and_its_clients_are_told_why(
    shm_prefix: str,
) -> None:
    d = DaemonProcess(shm_prefix, "--model", "faulty_model:faulty", env={"RTE_LANES": "sim"})
    try:
        with d.client() as client:
            client.attach("a")
            chunks = []
            limit = Deadline(30, "EngineGone")
            with pytest.raises(EngineGone, match="illegal memory access"):
                while True:
                    limit.check()
                    chunk = client.poll(timeout=0.5)
                    if chunk is not None:
                        chunks.append(chunk.chunk)
                        chunk.release()
            assert chunks and max(chunks) < FAULT_AT
        d.process.wait(30)  # it ends by itself
    finally:
        code = d.stop()
    assert code != 0 and "EngineFault" in d.stderr  # it failed, and says so
    assert leftovers(shm_prefix) == []


# -- 8. one daemon per GPU: --device --------------------------------------------------


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rte", "serve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_serve_refuses_a_device_it_cannot_use_in_one_line(shm_prefix: str) -> None:
    done = _serve("--name", shm_prefix, "--device", "gpu0")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--device 'gpu0': one of cpu, cuda, cuda:N" in done.stderr
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 8:
        done = _serve("--name", shm_prefix, "--device", "cuda:7", "--model", "torch")
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert f"torch sees {torch.cuda.device_count()} CUDA device" in done.stderr
    assert leftovers(shm_prefix) == []


def test_serve_puts_the_model_on_the_device_it_is_given(shm_prefix: str) -> None:
    pytest.importorskip("torch")
    d = DaemonProcess(shm_prefix, "--model", "torch", "--device", "cpu", "--max-sessions", "2")
    try:
        with d.client(timeout=60) as client:
            client.attach("a")
            assert client.poll(timeout=30) is not None
    finally:
        assert d.stop() == 0
    assert "lanes=cpu device=cpu" in d.stderr


# -- 5. unpinning says when CUDA refuses -----------------------------------------------


def test_unpinning_memory_cuda_refuses_raises_with_cudas_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUDA's refusal is raised, never left as its last error for a later launch to
    report. The runtime's answer is stood in for here (no GPU); the gpu-marked test
    below asks the real one."""
    torch = pytest.importorskip("torch")
    from shm import SegmentError, cuda  # noqa: PLC0415

    class Refusing:
        def cudaHostUnregister(self, address: int) -> int:  # CUDA's own names
            return 713

        def cudaGetErrorString(self, rc: int) -> str:
            return "part or all of the requested memory range is not registered"

    monkeypatch.setattr(torch.cuda, "cudart", Refusing)
    with pytest.raises(SegmentError, match=r"CUDA error 713 .*not registered"):
        cuda.unregister(4096, "a slab")


@pytest.mark.gpu
def test_unpinning_memory_never_pinned_raises_on_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from shm import SegmentError, cuda  # noqa: PLC0415

    memory = np.empty(1 << 20, np.uint8)
    with pytest.raises(SegmentError, match="cudaHostUnregister"):
        cuda.unregister(memory.ctypes.data, "an unpinned array")
    torch.cuda.synchronize()  # and CUDA's last error was not left set
