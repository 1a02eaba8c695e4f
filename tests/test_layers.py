"""The layout shows the layers: what imports what, what is installed, what
docs/layout.md says is where, and modules a reader can take in."""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from child_python import python_c

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rte", "shm", "tools")
MAX_MODULE_LINES = 430  # "no module over ~400 lines"


def _python(code: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``code`` in a child process in ``cwd``, with no PYTHONPATH: what is installed."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return python_c(code, timeout=120, cwd=cwd, env=environment)


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


def test_the_layout_doc_matches_the_tree() -> None:
    layout = (ROOT / "docs" / "layout.md").read_text()  # the README links to it
    named = set(re.findall(r"`((?:rte|shm|tools)/[\w/]*\.py)`", layout))
    modules = {
        str(p.relative_to(ROOT)) for p in _modules() if p.name not in ("__init__.py", "__main__.py")
    }
    assert sorted(named - modules) == [], "docs/layout.md names modules that do not exist"
    assert sorted(modules - named) == [], "modules docs/layout.md does not name"


def test_the_version_has_one_source_and_needs_no_install() -> None:
    import importlib.metadata  # noqa: PLC0415

    import rte  # noqa: PLC0415

    assert importlib.metadata.version("rte") == rte.__version__  # pyproject reads it
    elsewhere = _python(  # a checkout on sys.path, not installed: no metadata to ask
        "import importlib.metadata as m; m.version = None\n"
        "from rte.cli import main\nmain(['--version'])"
    )
    assert elsewhere.stdout.strip() == f"rte {rte.__version__}", elsewhere.stderr


# -- what imports what, drawn from the code ---------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it is imported (TYPE_CHECKING blocks and
    imports inside functions left out: they run later, or never)."""
    tree = ast.parse(path.read_text())
    package = _package(path)
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Try | ast.If | ast.With):
                for block in ("body", "orelse", "finalbody", "handlers"):
                    for inner in getattr(node, block, []):
                        visit(inner.body if isinstance(inner, ast.ExceptHandler) else [inner])
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(node, package)
                for a in node.names:  # a submodule, else a name in the module
                    found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in _names() else base)

    visit(tree.body)
    return found


def _every_import(path: Path) -> set[str]:
    """Every module ``path`` names in an import, wherever it is (inside functions
    and TYPE_CHECKING blocks too): a lazy import is an import all the same."""
    package = _package(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def _package(path: Path) -> str:
    """The package a relative import in module ``path`` is relative to."""
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    return package


def _from_base(node: ast.ImportFrom, package: str) -> str:
    """The module of ``from M import ...`` (a relative M resolved from ``package``)."""
    base = node.module or ""
    if node.level:
        base = ".".join([package.rsplit(".", node.level - 1)[0], base]).strip(".")
    return base


@functools.cache
def _names() -> frozenset[str]:
    return frozenset(_module_name(p) for p in _modules())


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in _modules()}
    return {
        name: {m for m in _imports(path) if m in paths} - {name} for name, path in paths.items()
    }


def test_the_client_and_the_daemon_never_import_each_other() -> None:
    for path in _modules():
        name = _module_name(path)
        imported = _every_import(path)
        if name.startswith("rte.client"):
            assert not [m for m in imported if m.startswith("rte.ipc")], name
        if name.startswith("rte.ipc"):
            assert not [m for m in imported if m.startswith("rte.client")], name
        if name.startswith("rte.protocol"):
            wrong = [m for m in imported if m.startswith(("rte.ipc", "rte.client", "rte.serve"))]
            assert not wrong, f"{name} imports {wrong}: the protocol sits below both sides"


def test_nothing_above_shm_imports_its_compiled_module() -> None:
    for path in _modules():
        if str(path.relative_to(ROOT)).startswith("shm/"):
            continue
        native = {m for m in _every_import(path) if m.startswith(("shm.native", "shm._native"))}
        assert not native, f"{path} imports {native}: use shm.Word and the shm API"


def test_no_import_cycle() -> None:
    graph = _graph()
    done: set[str] = set()
    path: list[str] = []

    def walk(name: str) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            pytest.fail(f"an import cycle: {' -> '.join(cycle)}")
        if name in done:
            return
        path.append(name)
        for imported in sorted(graph[name]):
            walk(imported)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        walk(name)
