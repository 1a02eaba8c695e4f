"""A refused pin of the slab: the daemon serves unpinned and says so, and CUDA's
last error is reset where the refusal happened, so no later kernel launch
reports it (issue 20, item 9)."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from daemon_harness import DaemonProcess, wait_for


def test_a_daemon_whose_slab_cannot_be_pinned_serves_unpinned_and_stops_with_0(
    shm_prefix: str,
) -> None:
    """It exited 1 at start ("the slab works unpinned", said the message)."""
    pytest.importorskip("torch")
    d = DaemonProcess(f"{shm_prefix}p", "--model", "pin_refused_model:pin_refused")
    try:
        wait_for(lambda: "ready" in d.said() or d.process.poll() is not None, 60, "ready")
        assert "slab_pinned=False" in d.said(), d.said()
        assert "not page-locked, serving unpinned" in d.said()
        with d.client() as client:  # it serves (nothing launched: no session steps here)
            assert client.manifest.model == "reference"
    finally:
        assert d.stop() == 0, d.stderr
    assert "stopped; its shared memory is unlinked" in d.stderr


@pytest.mark.gpu
def test_a_refused_pin_leaves_no_error_for_the_next_kernel_launch() -> None:
    """A second register of the same pages is refused (already registered), as is
    an unregister of pages no longer registered; after each, a kernel launch and
    torch's check after it see no error (they raised the refusal again)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from shm import SegmentError, cuda  # noqa: PLC0415

    pages = mmap.mmap(-1, 1 << 20)
    address = np.frombuffer(pages, np.uint8).ctypes.data
    assert cuda.register(address, len(pages), "some pages", 0)
    try:
        with pytest.raises(SegmentError, match="cudaHostRegister"):
            cuda.register(address, len(pages), "some pages", 0)
        assert float(torch.ones(1024, device="cuda:0").sum()) == 1024.0
    finally:
        cuda.unregister(address, "some pages", 0)
    with pytest.raises(SegmentError, match="cudaHostUnregister"):
        cuda.unregister(address, "some pages", 0)
    assert float(torch.ones(1024, device="cuda:0").sum()) == 1024.0
