"""A paced daemon answers a request between its ticks, not at the next one.

Its turns come once a period; between them it sleeps on its clients' inboxes, so
a suspend, a resume or an export (a session moving between paced daemons) is
answered as it comes: a move stalls the session about one period, not up to two.
Real daemon, real processes; the daemon's own next-tick word says whether a tick
passed while the call was answered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from daemon_harness import DaemonProcess

from rte.client import ShmClient

PERIOD_S = 1.0  # long: a call answered at once meets no tick in all but ~1% of tries


@pytest.fixture
def paced(shm_prefix: str) -> Iterator[DaemonProcess]:
    d = DaemonProcess(shm_prefix, "--model", "world", "--pace-hz", str(1 / PERIOD_S))
    yield d
    assert d.stop() == 0, d.stderr


def _within_one_tick(client: ShmClient, call: Callable[[], object], tries: int = 3) -> bool:
    """Whether ``call`` was answered, in one of ``tries``, before the daemon's next
    tick (its next-tick word unchanged across the call)."""
    control = client.transport.control
    for _ in range(tries):
        before = control.next_tick_ns
        call()
        if control.next_tick_ns == before:
            return True
    return False


def test_a_paced_daemon_answers_suspend_resume_and_export_between_ticks(
    paced: DaemonProcess,
) -> None:
    with paced.client() as client:
        client.attach("a", {"prompt": "a forest"}, timeout=5.0)
        chunk = client.poll(timeout=5.0)
        assert chunk is not None
        chunk.release()
        assert _within_one_tick(client, lambda: client.suspend("a", timeout=5.0))
        assert _within_one_tick(client, lambda: client.resume("a", timeout=5.0))

        def move_out_and_in() -> None:  # an export, then its attach with the state
            state = client.export("a", timeout=5.0)
            client.attach("a", state=state, timeout=5.0)

        assert _within_one_tick(client, move_out_and_in)
        assert "a" in client.sessions
