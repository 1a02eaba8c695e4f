"""Hosts of ``reference`` daemons on the nodes of test_ray's local cluster, for the
tests that move sessions between them (tests/test_ray_migrate.py, test_ray_drain.py)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

from test_ray import NODES  # (its cluster's nodes)

from rte.ray import start_hosts  # first: Ray's environment


def reference_hosts(name: str, rows: int) -> Iterator[tuple[list[Any], Any]]:
    """A host per node, each a ``reference`` daemon of ``rows`` rows named from
    ``name``, and their router; after the test each daemon must exit 0, and the
    actors are killed."""
    ray = importlib.import_module("ray")  # (the ray extra: its tests skip without it)
    started, router = start_hosts(
        ["--model", "reference", "--max-sessions", str(rows)], NODES, name=name
    )
    yield started, router
    codes = ray.get([h.stop.remote() for h in started], timeout=60)
    for actor in [*started, router]:
        ray.kill(actor)
    assert codes == [0] * NODES
