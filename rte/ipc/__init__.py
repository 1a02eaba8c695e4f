"""The daemon side of rte, built on the ``shm`` transport.

What it shares with its clients (names, layouts, the wire) is :mod:`rte.protocol`;
it never imports :mod:`rte.client`.

- :mod:`~rte.ipc.settings` — a daemon's settings, checked at once
- :mod:`~rte.ipc.allocator` — slab slots as the engine's output buffers
- :mod:`~rte.ipc.clients` — the client table: adopt, reap, quota-fair due list, idle
- :mod:`~rte.ipc.router` — session ownership, and where each answer goes
- :mod:`~rte.ipc.intake` — a client's requests, from its inbox to the serve loop and back
- :mod:`~rte.ipc.departures` — how sessions and clients leave: detach, reap, orphans, idle
- :mod:`~rte.ipc.outbound` — where outcomes go: a STEP record per owner from its leases
- :mod:`~rte.ipc.core` — the core loop: drain, step, emit, wait
- :mod:`~rte.ipc.process` — the process: signals, the name, resources, the worker thread
- :mod:`~rte.ipc.inspect` — what ``rte inspect`` reads, asking the daemon nothing
"""
