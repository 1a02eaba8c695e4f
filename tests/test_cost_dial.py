"""The cost dial: a model setting and a file change what a stage costs, never what it makes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from rte.composed import ComposedEngine
from rte.models import cost
from rte.models.cost import CostDial
from rte.models.learned import LearnedWorldModel


def _frames(model: LearnedWorldModel, steps: int = 4) -> list[np.ndarray]:
    engine = ComposedEngine(model, lanes="cpu")
    try:
        engine.attach("a", {"prompt": "a snowy forest"})
        out = []
        for _ in range(steps):
            for result in engine.step(["a"], None):
                if result.latent is not None:
                    out.append(result.latent.copy())
        return out
    finally:
        engine.close()


def test_a_costlier_world_makes_the_same_frames() -> None:
    plain = _frames(LearnedWorldModel(2, weights="random"))
    costly = _frames(LearnedWorldModel(2, weights="random", cost=3.0))
    assert len(plain) == len(costly) == 3
    for a, b in zip(plain, costly, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_file_multiplies_the_setting_and_keeps_its_last_good_factor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cost, "LOOK_EVERY_S", 0.0)  # look at every stage
    path = tmp_path / "cost"
    dial = CostDial(2.0, str(path))
    with dial.stage():  # no file yet: the setting holds
        pass
    assert dial.factor * dial.scale == 2.0
    path.write_text("2.5\n")
    with dial.stage():
        pass
    assert dial.factor * dial.scale == 5.0  # the file's factor on top of the setting
    path.write_text("not a number")
    os.utime(path, (1, 1))  # a new mtime, whatever the clock's resolution
    with dial.stage():
        pass
    assert dial.scale == 2.5


@pytest.mark.parametrize("factor", [0.0, -1.0, float("nan"), 1e9])
def test_a_factor_that_cannot_be_one_is_refused(factor: float) -> None:
    with pytest.raises(ValueError, match="cost factor"):
        CostDial(factor)
