"""Every model a command offers says what it is: above all, that ``torch`` is
untrained (random weights, frames of noise), a lane exerciser, not a world."""

from __future__ import annotations

import ast
from pathlib import Path

from rte.models import DESCRIPTIONS, SHORT_NAMES, model_choices

ROOT = Path(__file__).resolve().parents[1]


def test_every_short_name_has_a_description_the_help_shows() -> None:
    assert DESCRIPTIONS.keys() == SHORT_NAMES.keys()
    choices = model_choices()
    for name, text in DESCRIPTIONS.items():
        assert f"{name}: {text}" in choices
        assert ";" not in text  # the help's separator
    assert "trained" in DESCRIPTIONS["world"]


def test_the_torch_model_says_it_is_random_weights_everywhere() -> None:
    assert "random weights, untrained" in DESCRIPTIONS["torch"]
    assert "noise" in DESCRIPTIONS["torch"]
    tree = ast.parse((ROOT / "rte" / "models" / "world.py").read_text())  # (no torch import)
    module = ast.get_docstring(tree) or ""
    assert "random weights" in module.splitlines()[0] and "frames are noise" in module
    model = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TorchWorldModel"
    )
    assert "untrained" in (ast.get_docstring(model) or "")


def test_every_command_that_offers_a_model_says_what_each_is() -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    for command in ("demo", "play", "serve"):
        shown = subprocess.run(
            [sys.executable, "-m", "rte", command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
        ).stdout
        assert "torch: random weights, untrained" in " ".join(shown.split()), command
