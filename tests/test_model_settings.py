"""``rte serve --model-setting KEY=VALUE``: the model factory's own arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest
from daemon_harness import DaemonProcess

from rte.errors import ConfigurationError
from rte.ipc.sources import pairs_of as model_settings


def test_pairs_are_typed_and_a_malformed_one_is_refused() -> None:
    assert model_settings([]) is None
    got = model_settings(["cost=2", "margin=0.5", "pipelined=false", "weights=random"])
    assert got == {"cost": 2, "margin": 0.5, "pipelined": False, "weights": "random"}
    for bad in ("cost", "=2", "not a name=1"):
        with pytest.raises(ConfigurationError, match="KEY=VALUE"):
            model_settings([bad])


def test_a_daemon_builds_its_model_with_them(shm_prefix: str) -> None:
    daemon = DaemonProcess(
        f"{shm_prefix}ms", "--model", "world", "--max-sessions", "2",
        "--model-setting", "weights=random", "--model-setting", "cost=1.5",
    )  # fmt: skip
    try:
        with daemon.client() as client:
            client.attach("a")
            assert client.poll_batch(timeout=20) is not None
    finally:
        assert daemon.stop() == 0, daemon.stderr


def test_a_setting_the_model_does_not_take_stops_the_start_with_exit_2(shm_prefix: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rte", "serve", "--name", f"{shm_prefix}bad", "--model", "null",
         "--model-setting", "nosuch=1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "nosuch" in done.stderr and "ready" not in done.stderr
