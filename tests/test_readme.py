"""The README's client snippets run as printed, against a real daemon started as
the README starts it, and print what the README shows after each."""

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


def snippets() -> list[tuple[str, str | None]]:
    """The python blocks of the README's client section that talk to ``mydaemon``,
    each with the ``text`` block that follows it (what it prints), if any."""
    text = README.read_text()
    section = text[text.index("## Clients") : text.index("## Running the daemon")]
    found = re.findall(r"```python\n(.*?)```\s*(?:```text\n(.*?)```)?", section, re.S)
    return [(code, shown or None) for code, shown in found if '"mydaemon"' in code]


def started_as_the_readme_says() -> list[str]:
    """The arguments of the README's ``rte serve --name mydaemon ...`` line."""
    line = re.search(r"rte serve --name mydaemon([^&\n]*)&", README.read_text())
    assert line is not None, "the README starts no mydaemon"
    return line.group(1).split()


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    prefix = f"t{os.getpid()}x{uuid.uuid4().hex[:10]}"
    d = DaemonProcess(f"{prefix}readme", *started_as_the_readme_says(), "--max-sessions", "4")
    d.client().close()  # up
    yield d
    assert d.stop() == 0, d.stderr
    assert unlink_objects(shm_name(prefix)) == []


def test_the_readme_has_client_snippets_each_with_what_it_prints() -> None:
    assert len(snippets()) >= 3
    assert all(shown is not None for _, shown in snippets()), "a snippet shows no output"
    assert started_as_the_readme_says() == ["--pace-hz", "30"]


@pytest.mark.parametrize("index", range(len(snippets())))
def test_a_readme_snippet_runs_as_printed_and_prints_what_it_shows(
    daemon: DaemonProcess, index: int
) -> None:
    code, shown = snippets()[index]
    code = "from rte.client import connect\n" + code  # some continue the first
    done = subprocess.run(
        [sys.executable, "-c", code.replace('"mydaemon"', repr(daemon.name))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == shown, f"prints:\n{done.stdout}\nthe README shows:\n{shown}"
