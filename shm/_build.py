"""cffi builder (API mode) for shm._native: the C in csrc/ compiled at install time."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"


def _require_compiler() -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    missing = []
    if shutil.which(compiler) is None:
        missing.append(f"a C compiler ({compiler!r} is not on PATH)")
    if not include.exists():
        missing.append(f"the Python headers ({include} is missing)")
    if missing:
        raise SystemExit(
            "rte's shm package compiles a small C module and needs "
            + " and ".join(missing)
            + ". On Debian/Ubuntu: apt-get install gcc python3-dev; "
            "on Fedora: dnf install gcc python3-devel; on macOS: xcode-select --install."
        )


_require_compiler()
ffibuilder = FFI()
ffibuilder.cdef((CSRC / "shm_native.h").read_text())
ffibuilder.set_source(
    "shm._native",
    (CSRC / "shm_native.c").read_text(),
    include_dirs=[str(CSRC)],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
