"""Lanes: the CPU path never imports torch; CUDA streams where torch+CUDA exist."""

from __future__ import annotations

import threading

import pytest
from child_python import python_c

from rte.lanes import CpuLanes, Lane, make_lanes

NO_TORCH = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("rte imported torch on the CPU path")
        return None

sys.meta_path.insert(0, Refuse())
import rte
from rte.models import ReferenceModel
engine = rte.ComposedEngine(ReferenceModel(2))
engine.attach("a", {"prompt": "p"})
for i in range(3):
    engine.step(["a"], {"a": rte.Action({"prompt": f"p{i}"})})
engine.lanes.drain()
engine.step(["a"])
engine.close()
assert engine.lanes.kind == "cpu", engine.lanes.kind
assert "torch" not in sys.modules
print("ok")
"""


def test_importing_rte_and_running_the_cpu_path_never_imports_torch() -> None:
    done = python_c(NO_TORCH)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_cpu_lanes_run_inline_and_encode_on_a_worker_thread() -> None:
    lanes = CpuLanes()
    seen: list[tuple[Lane | None, str]] = []
    lanes.run(
        Lane.HOT, lambda _: seen.append((lanes.current, threading.current_thread().name)), None
    )
    completion = lanes.submit_encode(
        lambda _: seen.append((lanes.current, threading.current_thread().name)), None
    )
    lanes.drain()
    assert completion.done()
    completion.result()
    assert seen[0] == (Lane.HOT, threading.current_thread().name)
    assert seen[1][0] is Lane.ENCODE and seen[1][1].startswith("rte-encode")
    assert lanes.current is None
    lanes.close()


def test_encode_failure_surfaces_through_its_completion() -> None:
    lanes = CpuLanes()

    def broken(_: object) -> None:
        raise ValueError("bad encode")

    completion = lanes.submit_encode(broken, None)
    lanes.drain()  # waits, does not raise
    with pytest.raises(ValueError, match="bad encode"):
        completion.result()
    lanes.close()


def test_make_lanes_refuses_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="unknown lanes kind 'gpu'"):
        make_lanes("gpu")
    assert make_lanes("cpu").kind == "cpu"


@pytest.mark.gpu
def test_cuda_lanes_are_real_streams_created_on_the_stepping_thread() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    lanes = make_lanes("auto", "cuda:0")
    assert lanes.kind == "cuda"
    streams: dict[str, object] = {}

    def body() -> None:
        lanes.run(Lane.HOT, lambda _: streams.update(hot=torch.cuda.current_stream()), None)
        lanes.run(
            Lane.DEFERRED, lambda _: streams.update(deferred=torch.cuda.current_stream()), None
        )

    worker = threading.Thread(target=body)
    worker.start()
    worker.join(60)
    assert streams["hot"] != streams["deferred"]
    assert streams["hot"] != torch.cuda.default_stream()
    lanes.drain()
