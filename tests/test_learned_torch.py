"""The learned world in torch (rte.models.learned_torch): the NumPy model's frames,
through the torch model's lanes, graphs and slab path (CPU here; CUDA gpu-marked)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from child_python import python_c

from rte import Action, ComposedEngine
from rte.models import load_model
from rte.models.learned import LearnedWorldModel

torch = pytest.importorskip("torch", reason="needs the torch extra: pip install -e '.[torch]'")

from rte.models.learned_torch import TorchLearnedWorld  # noqa: E402

Frames = dict[tuple[str, int], np.ndarray[Any, Any]]


def run(model: Any, names: list[str], lanes: str = "cpu", steps: int = 8) -> Frames:
    engine = ComposedEngine(model, lanes=lanes)
    for name in names:
        engine.attach(name, {"prompt": f"a {name} world of snow"})
    out: Frames = {}
    for i in range(steps):
        actions = {s: Action({"move": (i % 3 - 1, 1)}) for s in names}
        if i == 3:
            actions[names[0]] = Action({"prompt": "a desert at night", "move": (1, 1)})
        out.update(
            {
                (r.session, r.chunk): np.array(r.latent)
                for r in engine.step(names, actions)
                if r.has_chunk
            }
        )
        engine.lanes.drain()  # the encode lands at the same chunk in every run
    engine.close()
    return out


def worst(a: Frames, b: Frames) -> tuple[int, int]:
    shared = set(a) & set(b)
    return max(int(np.abs(a[k].astype(int) - b[k].astype(int)).max()) for k in shared), len(shared)


@pytest.mark.parametrize("lanes", ["cpu", "sim"])
def test_its_frames_are_the_numpy_models_within_one_level(lanes: str) -> None:
    names = ["w0", "w1", "w2"]
    torched = run(TorchLearnedWorld(4, device="cpu"), names, lanes)
    numpy = run(LearnedWorldModel(4), names)
    difference, shared = worst(torched, numpy)
    assert shared >= 18 and difference <= 1


def test_padded_to_the_arena_a_session_is_the_same_solo_and_batched() -> None:
    batched = run(TorchLearnedWorld(4, device="cpu", batch_invariant=True), ["w0", "w1", "w2"])
    solo = run(TorchLearnedWorld(4, device="cpu", batch_invariant=True), ["w0"])
    difference, shared = worst(solo, batched)
    assert shared >= 6 and difference == 0


def test_world_is_numpy_on_the_cpu_and_torch_elsewhere() -> None:
    assert isinstance(load_model("world", max_sessions=2), LearnedWorldModel)
    assert isinstance(load_model("world", max_sessions=2, device="cpu"), LearnedWorldModel)
    assert isinstance(load_model("world-torch", max_sessions=2, device="cpu"), TorchLearnedWorld)
    code = "import sys\nfrom rte.models import load_model\nload_model('world')\n"
    code += "print('torch' in sys.modules)"
    done = python_c(code)
    assert done.stdout.strip() == "False", done.stderr  # the CPU path never imports torch


def test_the_larger_configuration_is_labelled_untrained_and_runs() -> None:
    model = TorchLearnedWorld(2, device="cpu", view=64, hidden=128, refine=64)
    assert model.describe() == {"view": 64, "hidden": 128, "refine": 64, "trained": False}
    frames = run(model, ["a"], steps=3)
    assert next(iter(frames.values())).shape == (64, 64, 3)
    assert TorchLearnedWorld(2, device="cpu").describe()["trained"] is True


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_on_cuda_with_graphs_it_is_the_numpy_world_within_one_level() -> None:
    model = TorchLearnedWorld(8, device="cuda")
    assert model.hot_graphs.failed is None and model.decode_graphs.failed is None
    difference, shared = worst(
        run(model, ["w0", "w1"], "auto"), run(LearnedWorldModel(8), ["w0", "w1"])
    )
    assert shared >= 12 and difference <= 1
    assert model.hot_graphs.replays > 0
