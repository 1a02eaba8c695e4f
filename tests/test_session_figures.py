"""Each session's real-time figures, counted by a real daemon and read from outside.

A paced daemon counts, per session, what its user feels (rte.ipc.figures); an
inspector reads them from the daemon's figures segment without asking it, and
``rte inspect`` and Prometheus show them. Assertions are on what was counted,
never on how fast.
"""

from __future__ import annotations

import subprocess
import sys
import time

from daemon_harness import DaemonProcess, wait_for

from rte.ipc.inspect import snapshot
from rte.ipc.metrics import prometheus
from rte.protocol.names import DaemonNames
from shm import Segment


def _live(name: str) -> list[dict[str, object]]:
    return [s for c in snapshot(name)["clients"] for s in c["session_figures"] if s["live"]]


def test_a_daemon_counts_what_each_session_felt_and_an_inspector_reads_it(
    shm_prefix: str,
) -> None:
    daemon = DaemonProcess(
        f"{shm_prefix}fig", "--model", "null", "--max-sessions", "4", "--pace-hz", "50"
    )
    try:
        with daemon.client() as client:
            client.attach("walker")
            client.attach("idler")
            got = {"walker": 0, "idler": 0}
            seqs = []
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                batch = client.poll_batch(timeout=0.05)
                if batch is None:
                    continue
                with batch:
                    for s in batch.sessions:
                        got[s] += 1
                if got["walker"] % 10 == 5 and len(seqs) < 5:
                    seqs.append(client.act("walker", {"tag": len(seqs) + 1}))
            wait_for(lambda: len(_live(daemon.name)) == 2, what="both sessions in the figures")
            figures = {s["session"]: s for s in _live(daemon.name)}
            for session, n in got.items():
                f = figures[session]
                # what it emitted: what this client took, and at most its credits more
                assert n <= f["chunks"] <= n + 2, (session, n, f)
                assert f["ttfc_ms"] is not None and f["ttfc_ms"] >= 0
                assert f["on_time_pct"] is not None and 0 < f["on_time_pct"] <= 100
                assert f["gap_p50_ms"] is not None and f["gap_p99_ms"] >= f["gap_p50_ms"]
                assert f["reductions"] == 0
            assert figures["walker"]["photon_p50_ms"] is not None  # its actions were timed
            assert figures["idler"]["photon_p50_ms"] is None  # it never acted
            text = subprocess.run(
                [sys.executable, "-m", "rte", "inspect", daemon.name],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
            assert "ON TIME" in text and "walker" in text and "idler" in text
            exposition = prometheus(snapshot(daemon.name))
            assert 'rte_sessions_below_realtime{daemon="' in exposition
            assert "rte_session_on_time_ratio_min" in exposition
            client.detach("idler")
            wait_for(lambda: len(_live(daemon.name)) == 1, what="the detached one no longer live")
    finally:
        assert daemon.stop() == 0, daemon.stderr


def test_no_client_can_write_the_figures(shm_prefix: str) -> None:
    daemon = DaemonProcess(f"{shm_prefix}fro", "--model", "null", "--max-sessions", "2")
    try:
        with daemon.client():
            name = DaemonNames(daemon.name).figures
            with Segment.open(name, readonly=True) as segment:  # anyone may read it
                assert segment.size > 0
            stat = __import__("os").stat(f"/dev/shm/{name.lstrip('/')}")
            assert stat.st_mode & 0o777 == 0o600  # the daemon's user alone
    finally:
        assert daemon.stop() == 0, daemon.stderr


def test_the_figures_count_the_chunks_of_steps_that_several_batches_made(
    shm_prefix: str,
) -> None:
    """Sessions attached one by one while the others stream: the steps just after
    each join decode several batches (a lease each, sent as one STEP record by the
    daemon's other path than the one C call), and every chunk of them is counted
    in its session's figures as the others are."""
    daemon = DaemonProcess(f"{shm_prefix}fsj", "--model", "null", "--max-sessions", "6")
    names = [f"s{i}" for i in range(6)]
    try:
        with daemon.client() as client:
            got = dict.fromkeys(names, 0)
            for session in names:
                client.attach(session)
                end = time.monotonic() + 0.2
                while time.monotonic() < end:
                    batch = client.poll_batch(timeout=0.05)
                    if batch is not None:
                        with batch:
                            for s in batch.sessions:
                                got[s] += 1
            for session in names:
                client.detach(session)  # (its last chunks: not taken, counted)
            wait_for(lambda: not _live(daemon.name), what="every session detached")
            counted = {
                s["session"]: s["chunks"]
                for c in snapshot(daemon.name)["clients"]
                for s in c["session_figures"]
            }
            for session, n in got.items():
                assert n > 0 and n <= counted[session] <= n + 3, (session, n, counted)
    finally:
        assert daemon.stop() == 0, daemon.stderr
