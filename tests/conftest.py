from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator

import pytest

from probe_model import ProbeModel, make_engine
from rte import ComposedEngine
from rte.simcuda import HAZARDS
from shm.names import objects, shm_name, unlink_objects


@pytest.fixture
def probe() -> Iterator[tuple[ComposedEngine, ProbeModel]]:
    """A pipelined ComposedEngine over a ProbeModel with 4 rows, closed after the test."""
    engine, model = make_engine(4)
    yield engine, model
    if model.encode_gate is not None:
        model.encode_gate.set()
    engine.close()


@pytest.fixture
def shm_prefix() -> Iterator[str]:
    """A unique name part for this test's segments and semaphores.

    What the test leaves under it in /dev/shm fails the test (a leak), and is
    removed all the same, so parallel runs never collide and nothing stays.
    A test that kills a daemon on purpose removes its leftovers itself.
    """
    prefix = f"t{os.getpid()}x{uuid.uuid4().hex[:10]}"
    yield prefix
    left = unlink_objects(shm_name(prefix))
    assert not left, f"the test left shared memory behind: {left}"


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_dev_shm() -> Iterator[None]:
    """After the whole suite, no segment of this run may remain."""
    yield
    left = objects(shm_name(f"t{os.getpid()}x"))
    assert not left, f"tests left shared memory behind: {left}"


@pytest.fixture(params=["cpu", "sim"])
def each_lanes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test on CPU lanes, then on CUDA lanes over the simulated device
    (``RTE_LANES=sim``: engines built in this process and daemons started from it).

    The simulated device runs stream work late and checks every launch for a
    race, so a missing event wait fails here as it would only sometimes on a GPU.
    """
    monkeypatch.setenv("RTE_LANES", request.param)
    before = len(HAZARDS)
    yield request.param
    assert HAZARDS[before:] == [], "the simulated device saw races"


# marker -> the module its extra installs (pyproject.toml registers the markers)
EXTRAS = {"torch": "torch", "ray": "ray"}


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked with an extra's name is skipped without it, the skip naming it."""
    for extra, module in EXTRAS.items():
        if item.get_closest_marker(extra) and importlib.util.find_spec(module) is None:
            pytest.skip(f"needs the {extra} extra: pip install -e '.[{extra}]'")
