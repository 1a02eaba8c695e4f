from __future__ import annotations

from collections.abc import Iterator

import pytest

from probe_model import ProbeModel, make_engine
from rte import ComposedEngine


@pytest.fixture
def probe() -> Iterator[tuple[ComposedEngine, ProbeModel]]:
    """A pipelined ComposedEngine over a ProbeModel with 4 rows, closed after the test."""
    engine, model = make_engine(4)
    yield engine, model
    if model.encode_gate is not None:
        model.encode_gate.set()
    engine.close()
