"""The README's client snippets run as printed, against a real daemon."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess

from shm.names import shm_name, unlink_objects

README = Path(__file__).resolve().parent.parent / "README.md"


def snippets() -> list[str]:
    """The python blocks of the README's client section that talk to ``mydaemon``."""
    text = README.read_text()
    section = text[text.index("## Clients") : text.index("## Running the daemon")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    return [b for b in blocks if '"mydaemon"' in b]


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    prefix = f"t{os.getpid()}x{uuid.uuid4().hex[:10]}"
    d = DaemonProcess(f"{prefix}readme", "--max-sessions", "4")
    yield d
    assert d.stop() == 0, d.stderr
    assert unlink_objects(shm_name(prefix)) == []


def test_the_readme_has_client_snippets() -> None:
    assert len(snippets()) >= 3


@pytest.mark.parametrize("index", range(len(snippets())))
def test_a_readme_snippet_runs_as_printed(daemon: DaemonProcess, index: int) -> None:
    code = "from rte.client import connect\n" + snippets()[index]  # some continue the first
    done = subprocess.run(
        [sys.executable, "-c", code.replace('"mydaemon"', repr(daemon.name))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
