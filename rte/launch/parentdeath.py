"""A child process that ends when the process that started it dies, however it dies.

A daemon launched by another program (the supervisor's replicas, the daemon of
``rte play`` or ``rte demo``, a Ray host's) must not outlive it: SIGKILLed, the
launcher runs no ``finally`` and stops nothing, and its children would serve on
for ever with parent pid 1, holding their shared memory. So the child asks the
kernel, between fork and exec, for ``PR_SET_PDEATHSIG``: SIGTERM when its parent
dies, which an ``rte serve`` handles from its first instruction (it finalizes its
sessions and unlinks its shared memory, :mod:`rte.ipc.signals`).
:class:`rte.launch.LaunchedDaemon` asks for it for every daemon it starts.

Three things make that hold:

- **prctl is looked up here, at import**, never in the child: a forked child of
  a threaded process must not ``dlopen`` or ``dlsym`` (a loader lock held by
  another thread at the fork would hang it before its exec). Between fork and
  exec the child only calls the function found here and ``getppid``.
- **A parent that died before the call** (between fork and prctl) sends no
  signal: the child checks ``getppid()`` after setting it and does not start.
- **The signal comes when the parent's *thread* that forked ends**, not the
  process: launch from a thread that lives as long as the process does (the
  main thread, as the supervisor, ``rte play`` and ``rte demo`` do), or the
  child is told its parent died while it still lives.

Linux only; elsewhere :func:`dies_with_this_process` gives ``None`` (no tie).
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
# looked up here: a forked child of a threaded process must not dlopen or dlsym
_PRCTL = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
if _PRCTL is not None:
    _PRCTL.argtypes = [ctypes.c_int, ctypes.c_ulong]
    _PRCTL.restype = ctypes.c_int


def dies_with(parent: int, sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when
    process ``parent`` (the caller: its pid before the fork) dies, and does not
    start if it already has (``Popen`` then raises ``SubprocessError``)."""
    prctl = _PRCTL
    if prctl is None:
        return None

    def die_with_parent() -> None:  # in the child, before exec: no lock taken, nothing loaded
        if prctl(PR_SET_PDEATHSIG, sig) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # it died before the call: no signal will come
            raise ProcessLookupError(f"the launching process {parent} is gone")

    return die_with_parent


def dies_with_this_process(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """:func:`dies_with` this process; call it on the thread that starts the child."""
    return dies_with(os.getpid(), sig)
