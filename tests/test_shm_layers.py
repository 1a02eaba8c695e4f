"""How shm is cut, read from its code: no module uses another object's private
members (issue 22: ``shm/batch.py`` reached into ``Slab``'s, ``wait_any`` into each
ring's), and "are these slots one run" has one definition, :func:`shm.one_run`."""

from __future__ import annotations

import ast
from pathlib import Path

SHM = Path(__file__).resolve().parents[1] / "shm"


def _private_reaches(path: Path) -> list[str]:
    """``x._name`` where ``x`` is not ``self`` or ``cls`` (dunders and the cffi
    module's own names left aside)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        if not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_shm_module_reaches_into_another_objects_private_members() -> None:
    reaches = [r for path in sorted(SHM.glob("*.py")) for r in _private_reaches(path)]
    assert reaches == []


def test_only_one_run_decides_whether_slots_are_one_run() -> None:
    """Every module but shm/slots.py that asks calls one_run; none compares slot
    numbers another way (a diff of the slots, or their endpoints alone)."""
    for path in sorted(SHM.glob("*.py")):
        text = path.read_text()
        if path.name == "slots.py":
            continue
        assert "np.diff" not in text, path
        assert "slots[-1]" not in text, path
