"""rte on a Ray cluster (the optional extra ``.[ray]``): one daemon per GPU.

- :func:`start_hosts` — a :class:`~rte.ray.hosting.DaemonHost` actor per node
  that declares the resource (``rte_gpu`` by default: one per GPU), each owning
  an ``rte serve`` daemon there, and the :class:`~rte.ray.hosting.Router`.
- :class:`~rte.ray.client.RayClient` — a caller anywhere, an EngineClient over
  :class:`~rte.ray.transport.RayTransport`: sessions admitted by free rows and
  sticky; this node's daemons through shared memory, the others' chunks pushed
  by their hosts (:mod:`rte.ray.relay`, :mod:`rte.ray.remote`); a lost node's
  sessions alone lost. ``export``, ``attach(s, state=...)``, ``migrate(s, to=)``
  and ``drain(host)`` move a session between nodes, its state through Ray's
  object store.
- :func:`~rte.ray.cluster.local_cluster` — several nodes on this machine, every
  Ray process on 127.0.0.1 only (also :func:`~rte.ray.cluster.loopback_environment`).

Nothing here is a scheduler or a protocol of our own: placement is Ray's
resources, transport between nodes Ray's object store. Importing this package
sets Ray's environment for loopback-only operation (Ray reads it when it is
imported): import ``rte.ray`` before ``ray``.
"""

from __future__ import annotations

from typing import Any

from rte.ray.cluster import local_cluster, loopback_environment

loopback_environment()

from rte.ray.client import Frame, RayClient  # noqa: E402 (after the environment)
from rte.ray.hosting import DaemonHost, Router  # noqa: E402


def start_hosts(
    args: list[str], count: int, *, name: str = "rte", resource: str = "rte_gpu"
) -> tuple[list[Any], Any]:
    """``count`` DaemonHost actors (daemons ``NAME-0`` ...), each taking one unit of
    ``resource`` (so one per node that declares one), and a Router over them, on
    this caller's node (it outlives the others)."""
    import ray  # noqa: PLC0415
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

    host: Any = ray.remote(num_cpus=0, max_restarts=0)(DaemonHost)
    hosts = [
        host.options(resources={resource: 1}).remote(f"{name}-{i}", list(args))
        for i in range(count)
    ]
    ray.get([h.where.remote() for h in hosts], timeout=120)  # every daemon up
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    router_class: Any = ray.remote(num_cpus=0)(Router)
    router = router_class.options(scheduling_strategy=here).remote(hosts)
    return hosts, router


__all__ = [
    "DaemonHost",
    "Frame",
    "RayClient",
    "Router",
    "local_cluster",
    "loopback_environment",
    "start_hosts",
]
