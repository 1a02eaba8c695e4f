"""A child's stderr read while the child still writes it loses nothing."""

from __future__ import annotations

import subprocess
import sys

from daemon_harness import Deadline

from rte.launch.childlog import child_log, said

LINES = 3000


def test_reading_a_child_log_while_it_writes_never_overwrites_a_line() -> None:
    """The parent reads as fast as it can while the child writes a line at a
    time; every line is there after, once and in order (a log opened without
    append had the child's writes land where the parent's read left the shared
    offset: over its earlier lines)."""
    script = (
        f"import sys\nfor i in range({LINES}):\n    print('line', i, file=sys.stderr, flush=True)"
    )
    with child_log() as log:
        child = subprocess.Popen([sys.executable, "-c", script], stderr=log)
        reads = 0
        limit = Deadline(what="the child writing")
        while child.poll() is None:
            limit.check(reads)
            said(log)
            reads += 1
        assert child.wait(timeout=10) == 0
        assert said(log).splitlines() == [f"line {i}" for i in range(LINES)]
