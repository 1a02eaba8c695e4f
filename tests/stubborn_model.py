"""A model whose detach always fails, for sessions the engine keeps.

``rte serve --model stubborn_model:stubborn`` (with tests/ on PYTHONPATH).
"""

from __future__ import annotations

from typing import Any

from rte.models import ReferenceModel


class Stubborn(ReferenceModel):
    def detach(self, row: int) -> None:
        raise RuntimeError(f"row {row} will not let go")


def stubborn(**settings: Any) -> Stubborn:
    return Stubborn(**settings)
