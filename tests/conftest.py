"""Fixtures every suite shares, and collection where the transport cannot load.

On a machine without shm's dependencies (posix_ipc, cffi's backend, the compiled
module: a device box before ``tools/gpu_run.sh`` installs them) the suite still
collects: a test module that needs them is skipped with the reason, and so is
every test that asks for ``shm_prefix``; the rest run.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import early_runs
import pytest

from probe_model import ProbeModel, make_engine
from rte import ComposedEngine
from rte.lanes.sim import HAZARDS


def _transport_missing() -> str | None:
    """Why shm cannot load here (a missing dependency), or None when it can."""
    try:
        import shm.names  # noqa: PLC0415 (imports posix_ipc)
        import shm.native  # noqa: F401, PLC0415 (the compiled module, through cffi)
    except ImportError as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
        return (
            f"the shared-memory transport cannot load here ({cause}): install the "
            "project's dependencies (pip install -e .; on a device box tools/gpu_run.sh)"
        )
    return None


TRANSPORT_MISSING = _transport_missing()


class _TransportModule(pytest.Module):
    """A test module that is skipped, with the reason, when it needs the transport
    and the transport cannot load (instead of an error at collection)."""

    def collect(self) -> Any:
        try:
            return super().collect()
        except self.CollectError:
            if TRANSPORT_MISSING is None:
                raise
            pytest.skip(TRANSPORT_MISSING)


def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> Any:
    if TRANSPORT_MISSING is None:
        return None  # the default collection
    return _TransportModule.from_parent(parent, path=module_path)


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
    if TRANSPORT_MISSING is not None:
        pytest.skip(TRANSPORT_MISSING)
    from shm.names import shm_name, unlink_objects  # noqa: PLC0415 (needs posix_ipc)

    prefix = f"t{os.getpid()}x{uuid.uuid4().hex[:10]}"
    yield prefix
    left = unlink_objects(shm_name(prefix))
    assert not left, f"the test left shared memory behind: {left}"


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_dev_shm() -> Iterator[None]:
    """After the whole suite, no segment of this run may remain."""
    yield
    if TRANSPORT_MISSING is not None:
        return  # nothing could have made one
    from shm.names import objects, shm_name  # noqa: PLC0415 (needs posix_ipc)

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
    extra = _extra_missing(item)
    if extra is not None:
        pytest.skip(f"needs the {extra} extra: pip install -e '.[{extra}]'")


def _extra_missing(item: pytest.Item) -> str | None:
    """The extra a test is marked with and this machine lacks (None: it runs)."""
    for extra, module in EXTRAS.items():
        if item.get_closest_marker(extra) and importlib.util.find_spec(module) is None:
            return extra
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    """The long checks of the collected tests start now, beside the rest (early_runs)."""
    early_runs.start([item for item in session.items if not _extra_missing(item)])


def pytest_sessionfinish(session: pytest.Session) -> None:
    early_runs.stop()
