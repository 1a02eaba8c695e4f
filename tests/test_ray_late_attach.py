"""A RayClient move whose attach timed out leaves no second copy (as a pool's:
rte.client.late_attaches). The target host's daemon is SIGSTOPped, so the move's
attach there gets no answer in its time and the state goes back to the daemon
it came from; once the target runs again it takes that first attach up late:
the caller detaches that copy at once, its chunks never handed out. The stream
has no chunk twice, its frames are the never-moved twin's, and a move to the
target then works."""

from __future__ import annotations

import os
import signal
from typing import Any

import psutil
import pytest
from daemon_harness import Deadline
from test_drain import record
from test_drain_at_once import _stop
from test_migrate import _same_as, _twin
from test_ray import nodes  # noqa: F401 (the module's cluster)
from test_ray_drain import hosts  # noqa: F401 (a host per node, two rows each)

from rte.errors import AdmissionError
from rte.ray import RayClient

ray = pytest.importorskip("ray", reason="the ray extra (in the dev extra): pip install -e '.[ray]'")


def _pid_of(daemon: str) -> int:
    """The pid of ``rte serve --name DAEMON`` (a host's child, on this machine)."""
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "serve" in cmdline and daemon in cmdline:
            return int(process.pid)
    raise AssertionError(f"no process serves {daemon!r}")


def _until(client: RayClient, frames: dict[str, dict[int, Any]], last: int) -> None:
    limit = Deadline(30, what="session a's frames")
    while last not in frames.get("a", {}):
        limit.check(sorted(frames.get("a", {}))[-3:])
        record(client, frames)


def test_a_ray_move_whose_attach_timed_out_leaves_no_copy_on_its_target(
    hosts: tuple[list[Any], Any],  # noqa: F811
) -> None:
    started, router = hosts
    twin = _twin({"a": 30})["a"]
    frames: dict[str, dict[int, Any]] = {}
    here = ray.get_runtime_context().get_node_id()
    with RayClient(router, started) as client:
        local = next(i for i, (_, node) in enumerate(client.places) if node == here)
        remote = next(i for i in range(len(client.places)) if i != local)
        client.attach("a", {"prompt": "forest"}, credits=1, timeout=30)
        if client.home["a"] != local:
            client.migrate("a", to=local, timeout=30)
        _until(client, frames, 3)
        target = client.places[remote][0]
        pid = _pid_of(target)
        _stop(pid)
        try:
            with pytest.raises(AdmissionError, match="back on"):
                client.migrate("a", to=remote, timeout=1.0)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert client.home["a"] == local and client.sessions == {"a"}
        lates = getattr(client.transport, "late_attaches", None)  # (the client's record)
        notices: list[Any] = []
        limit = Deadline(60, what="the target's late copy taken up and detached")
        while lates:  # its ATTACHED came (a copy detached), then its DETACHED
            limit.check((lates.by_seq, lates.copies, sorted(frames["a"])[-3:]))
            record(client, frames)  # (a chunk of the copy's handed out: "came twice")
            notices += client.notices()
        _until(client, frames, max(frames["a"]) + 5)
        limit = Deadline(30, what="the target's row free again (no copy left there)")
        while client.transport.free_rows(target) != 2:
            limit.check()
            record(client, frames)
        notices += client.notices()
        assert notices == [], notices  # none of the copy's reached the caller
        assert client.home["a"] == local
        assert client.migrate("a", to=remote, timeout=30) == target
        _until(client, frames, 30)
    _same_as({i: f for i, f in frames["a"].items() if i <= 30}, twin, 30)
