"""The layout shows the layers: what imports what, what is installed, what the
README says is where, and modules a reader can take in."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rte", "shm", "tools")
MAX_MODULE_LINES = 430  # "no module over ~400 lines"


def _python(code: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_engine_imports_without_the_transport() -> None:
    done = _python(
        "import sys, rte, rte.models, rte.serve; "
        "assert 'shm' not in sys.modules, [m for m in sys.modules if m.startswith('shm')]"
    )
    assert done.returncode == 0, done.stderr


def test_shm_knows_nothing_of_the_engine() -> None:
    for path in (ROOT / "shm").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n == "rte" or n.startswith("rte.") for n in names), path


@pytest.mark.timeout(300)
def test_only_rte_and_shm_are_installed(tmp_path: Path) -> None:
    source = tmp_path / "source"
    for part in PACKAGES:
        shutil.copytree(
            ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__", "*.so")
        )
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", str(source), "-w", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = tmp_path.glob("rte-*.whl")
    site = tmp_path / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    installed = sorted(p.name for p in site.iterdir() if (p / "__init__.py").exists())
    assert installed == ["rte", "shm"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _python(
        f"import sys; sys.path.insert(0, {str(site)!r}); import rte.client, shm\n"
        f"assert rte.__file__.startswith({str(site)!r}), rte.__file__\n"
        "try:\n    import tools\nexcept ModuleNotFoundError:\n    print('no tools')\n",
        cwd=elsewhere,
    )
    assert done.stdout.strip() == "no tools", done.stderr


def _modules() -> list[Path]:
    return sorted(p for part in PACKAGES for p in (ROOT / part).rglob("*.py"))


def test_every_module_says_what_it_is_for_and_stays_readable() -> None:
    for path in _modules():
        text = path.read_text()
        assert ast.get_docstring(ast.parse(text)), f"{path} does not open with a docstring"
        lines = text.count("\n")
        assert lines <= MAX_MODULE_LINES, f"{path} has {lines} lines"


def test_the_readme_layout_matches_the_tree() -> None:
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    named = set(re.findall(r"`((?:rte|shm|tools)/[\w/]*\.py)`", layout))
    modules = {
        str(p.relative_to(ROOT)) for p in _modules() if p.name not in ("__init__.py", "__main__.py")
    }
    assert sorted(named - modules) == [], "the README names modules that do not exist"
    assert sorted(modules - named) == [], "modules the README's layout does not name"


def test_the_version_has_one_source_and_needs_no_install() -> None:
    import importlib.metadata  # noqa: PLC0415

    import rte  # noqa: PLC0415

    assert importlib.metadata.version("rte") == rte.__version__  # pyproject reads it
    elsewhere = _python(  # a checkout on sys.path, not installed: no metadata to ask
        "import importlib.metadata as m; m.version = None\n"
        "from rte.cli import main\nmain(['--version'])"
    )
    assert elsewhere.stdout.strip() == f"rte {rte.__version__}", elsewhere.stderr
