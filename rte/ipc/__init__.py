"""The daemon side of rte, built on the ``shm`` transport.

- :mod:`~rte.ipc.names` — every shared-object name of a daemon (one value object)
- :mod:`~rte.ipc.control` — the control segment's layout: state, counters, client table
- :mod:`~rte.ipc.wire` — the records on the rings; :mod:`~rte.ipc.values` the conditioning codec
- :mod:`~rte.ipc.settings` — a daemon's settings, checked at once
- :mod:`~rte.ipc.allocator` — slab slots as the engine's output buffers
- :mod:`~rte.ipc.clients` — the client table: adopt, reap, quota-fair due list, idle
- :mod:`~rte.ipc.router` — session ownership, and where each answer goes
- :mod:`~rte.ipc.core` — the core loop: drain, step, emit
- :mod:`~rte.ipc.process` — the process: signals, the name, resources, the worker thread
- :mod:`~rte.ipc.inspect` — what ``rte inspect`` reads, asking the daemon nothing
"""
