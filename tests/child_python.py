"""Python run in a child interpreter (this one), for what must hold in a fresh
process: an import that must not happen, a module blocked, a bug's last words."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def python_c(
    code: str,
    *args: str,
    timeout: float = 60,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS``, its output captured as text; its exit code is the
    caller's to check."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env=env,
    )
