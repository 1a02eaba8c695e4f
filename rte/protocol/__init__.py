"""What a daemon and its clients share, and nothing else.

The daemon (:mod:`rte.ipc`) and the clients (:mod:`rte.client`) never import
each other; both import this. It holds the names of a daemon's objects
(:mod:`~rte.protocol.names`), the layouts of its shared words (the control
block, the claims table, a client's mailbox: :mod:`~rte.protocol.control`,
:mod:`~rte.protocol.claims`, :mod:`~rte.protocol.mailbox`), the latency
histograms both sides add to (:mod:`~rte.protocol.latency`), the input
segment's layout (:mod:`~rte.protocol.inputs`), the requests
(:mod:`~rte.protocol.requests`) and how they and their values travel
(:mod:`~rte.protocol.wire`, :mod:`~rte.protocol.values`).
"""
