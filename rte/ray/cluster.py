"""Ray on 127.0.0.1 only: the settings every rte process that touches Ray uses,
and a local multi-node cluster from Ray's own utilities (for tests and trials).

Ray, left to itself, rewrites ``127.0.0.1`` to the machine's outbound address,
starts an API server that probes cloud metadata services and reports usage,
and keeps its session files in ``/tmp/ray``. :func:`loopback_environment`
sets, before ``import ray`` (and so for every process Ray starts from here):
usage statistics off, no rewriting of the loopback address, the usage report
URL on loopback, and a short ``RAY_TMPDIR`` of our own. :func:`local_cluster`
starts a head and worker nodes with every server bound to 127.0.0.1, the
dashboard off and the head's API server not started at all (it is what makes
the outside calls; rte uses only actors and the object store), each node
declaring the resources it is given (e.g. ``{"rte_gpu": 1}``: one daemon per
node, placed by Ray), and fast node health checks, so that a node that dies
is known dead in about a second.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

LOOPBACK = "127.0.0.1"
HEALTH = {  # a dead node is declared dead after ~0.6 s of missed checks
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 200,
    "health_check_failure_threshold": 3,
}


def loopback_environment() -> None:
    """Set Ray's environment for loopback-only operation (call before ``import ray``)."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep 127.0.0.1 as it is
    os.environ["RAY_USAGE_STATS_REPORT_URL"] = f"http://{LOOPBACK}:9/"
    # a host's daemon outlives its worker by a moment: it is told (SIGTERM, by the
    # kernel) and cleans up, instead of being killed with the worker
    os.environ["RAY_kill_child_processes_on_worker_exit"] = "0"  # noqa: SIM112 (Ray's spelling)
    if "RAY_TMPDIR" not in os.environ:  # short: Unix socket paths must stay < 108 bytes
        os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rte-ray-", dir="/tmp")


def node_args(resources: dict[str, float], cpus: int = 1) -> dict[str, Any]:
    return {
        "node_ip_address": LOOPBACK,
        "include_dashboard": False,
        "num_cpus": cpus,
        "object_store_memory": 100 * 2**20,
        "resources": dict(resources),
    }


@contextlib.contextmanager
def _no_api_server() -> Iterator[None]:
    import ray._private.node  # noqa: PLC0415 (Ray is an optional extra)

    node: Any = ray._private.node.Node
    original = node.start_api_server

    def skip(self: Any, *, include_dashboard: bool, raise_on_failure: bool) -> None:
        self._webui_url = None

    node.start_api_server = skip
    try:
        yield
    finally:
        node.start_api_server = original


@contextlib.contextmanager
def local_cluster(nodes: list[dict[str, float]]) -> Iterator[Any]:
    """A head and ``len(nodes) - 1`` workers, node i declaring ``nodes[i]``, this
    process connected as the driver; yields the ``ray.cluster_utils.Cluster``
    (``cluster.list_all_nodes()``, ``cluster.remove_node(node)``). On exit:
    shut down, and the session files removed."""
    loopback_environment()
    import ray  # noqa: PLC0415
    from ray.cluster_utils import Cluster  # noqa: PLC0415

    head = node_args(nodes[0]) | {"_system_config": HEALTH}
    with _no_api_server():
        cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for resources in nodes[1:]:
            cluster.add_node(**node_args(resources))
        cluster.wait_for_nodes(timeout=60)
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
        shutil.rmtree(os.path.join(os.environ["RAY_TMPDIR"], "ray"), ignore_errors=True)
