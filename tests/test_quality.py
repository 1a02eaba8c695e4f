"""Lint, format and types are part of the tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import early_runs
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*command: str) -> None:
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout}\n{done.stderr}"


def _ruff() -> str:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: pip install -e '.[dev]'")
    return ruff


def test_ruff_check() -> None:
    _run(_ruff(), "check", ".")


def test_ruff_format() -> None:
    _run(_ruff(), "format", "--check", ".")


@pytest.mark.timeout(600)
@pytest.mark.torch  # it types rte's torch and Ray code against their packages
@pytest.mark.ray
def test_mypy_strict() -> None:
    done = early_runs.result("test_quality.py::test_mypy_strict", timeout=590)  # (started
    assert done.returncode == 0, f"{' '.join(done.command)}\n{done.output}"  # at collection)
