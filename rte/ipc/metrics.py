"""A daemon's state in the Prometheus text exposition format (version 0.0.4).

``rte inspect NAME --prometheus`` prints it; like everything ``rte inspect``
shows, it is read from the daemon's segments without asking the daemon
anything (:func:`rte.ipc.inspect.snapshot`), so a scraper never adds work to
the serve loop. Counters are the daemon's own (its waits, sleeps and wake-ups
among them) and its clients' rings' wake-ups; gauges are its clients' rings,
slots and sessions, and the wake-ups per step of each side; the two histograms
are the daemon's step times and its emitted-to-pushed delivery times, with one
bucket per power of two of the log-linear buckets it keeps
(:mod:`rte.protocol.latency`), in seconds.

``rte serve --metrics-port PORT`` also serves it at
``http://127.0.0.1:PORT/metrics`` (:func:`serve_metrics`), on loopback only,
reading the segments as ``rte inspect`` does, with a bounded cost under any
load: a burst of connections waits in a listen queue of :data:`BACKLOG` (the
default of 5 sent the rest into the kernel's SYN retries, 1 s, 3 s, 7 s...: a
burst of 200 scrapes had some wait a minute); the accepting thread hands each
to a queue of at most :data:`WAITING` that :data:`WORKERS` threads answer (never
a thread per connection); past that bound a connection is answered 503 at once
and closed; a client that has not sent its request in :data:`REQUEST_TIMEOUT_S`
is dropped, so an idle connection holds a worker that long at most.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from rte.ipc.inspect import snapshot
from rte.protocol import latency

PREFIX = "rte_"
BACKLOG = 256  # connections the kernel holds for us to accept
WAITING = 256  # connections accepted, waiting for a worker; past it: 503 at once
WORKERS = 4
REQUEST_TIMEOUT_S = 2.0  # a scraper sends its request at once
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
log = logging.getLogger("rte.metrics")
COUNTERS = {  # the daemon's counter -> (metric, help)
    "chunks": ("chunks_total", "Chunks delivered to clients."),
    "steps": ("steps_total", "Engine steps run."),
    "requests": ("requests_total", "Requests read from clients."),
    "errors": ("errors_total", "Requests refused with an error."),
    "admission_rejections": ("admissions_refused_total", "Attaches refused for capacity."),
    "chunks_dropped": ("chunks_dropped_total", "In-flight chunks dropped at a detach."),
    "notices_dropped": ("notices_dropped_total", "Answers lost to a full ring and backlog."),
    "idle_detaches": ("idle_detaches_total", "Sessions detached for a stalled client."),
    "dead_clients_reaped": ("dead_clients_reaped_total", "Dead clients reclaimed."),
    "clients_disconnected": ("clients_disconnected_total", "Clients revoked for flooding."),
    "idle_waits": ("daemon_waits_total", "Waits of the daemon that found nothing to do."),
    "idle_sleeps": ("daemon_sleeps_total", "Waits of the daemon that slept on its doorbell."),
    "wakeups": ("daemon_wakeups_total", "Sleeps of the daemon a client's post ended."),
}


def prometheus(snap: dict[str, Any]) -> str:
    """The exposition text of one :func:`~rte.ipc.inspect.snapshot`."""
    daemon = f'daemon="{_escape(snap["name"])}"'
    out: list[str] = []

    def metric(name: str, kind: str, text: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {PREFIX}{name} {text}")
        out.append(f"# TYPE {PREFIX}{name} {kind}")
        out.extend(f"{PREFIX}{name}{{{labels}}} {_number(v)}" for labels, v in samples)

    summary = snap["summary"]
    metric("up", "gauge", "1 while the daemon's process lives.", [(daemon, summary["alive"])])
    sessions = [(daemon, summary.get("sessions", 0))]
    metric("sessions", "gauge", "Sessions attached.", sessions)
    clients = snap["clients"]
    metric("clients", "gauge", "Clients connected.", [(daemon, len(clients))])
    rt = snap.get("realtime") or {}
    for name, text, value in (
        (
            "capacity_sessions",
            "Sessions the pace holds in real time (-1: unknown).",
            -1 if rt.get("capacity") is None else rt["capacity"],
        ),
        ("pace_hz", "The daemon's pace (0: unpaced).", rt.get("pace_hz", 0)),
        (
            "sessions_reduced",
            "Sessions stepped at a reduced rate (overload).",
            rt.get("reduced", 0),
        ),
        (
            "turn_cost_seconds",
            "The turn's cost model: seconds per turn (a).",
            rt.get("cost_a_s", 0),
        ),
        ("turn_cost_row_seconds", "... and per session (b).", rt.get("cost_b_s", 0)),
    ):
        metric(name, "gauge", text, [(daemon, value)])
    for name, key, text in (
        ("ticks_late_total", "ticks_late", "Paced ticks begun over half a period late."),
        ("ticks_missed_total", "ticks_missed", "Paced ticks skipped: a turn ran past the next."),
    ):
        metric(name, "counter", text, [(daemon, rt.get(key, 0))])
    live = [s for c in clients for s in c.get("session_figures", []) if s["live"]]
    on_time = [s["on_time_pct"] for s in live if s["on_time_pct"] is not None]
    for name, text, value in (
        (
            "sessions_below_realtime",
            "Live sessions with under 99% of their chunks on time.",
            sum(1 for v in on_time if v < 99),
        ),
        (
            "session_on_time_ratio_min",
            "The lowest share of chunks on time of any live session (1 with none).",
            min(on_time, default=100.0) / 100,
        ),
        (
            "sessions_parked",
            "Live sessions parked: their rows freed, their states in host memory.",
            sum(1 for s in live if s.get("parked_bytes")),
        ),
        (
            "sessions_parked_bytes",
            "The bytes of the parked sessions' states.",
            sum(s.get("parked_bytes", 0) for s in live),
        ),
        (
            "session_stall_longest_seconds",
            "The longest stall of any live session (its longest gap less a period).",
            max((s["longest_stall_ms"] for s in live), default=0.0) / 1e3,
        ),
    ):
        metric(name, "gauge", text, [(daemon, value)])
    counters = snap["counters"]
    for key, (name, text) in COUNTERS.items():
        metric(name, "counter", text, [(daemon, counters.get(key, 0))])
    per_client = [(f'{daemon},client="{c["index"]}"', c) for c in clients]
    metric(
        "client_sessions",
        "gauge",
        "Sessions of each client.",
        [(labels, c["sessions"]) for labels, c in per_client],
    )
    metric(
        "client_ring_used_bytes",
        "gauge",
        "Bytes waiting in each client's rings.",
        [
            (f'{labels},ring="{ring}"', stats["used_bytes"])
            for labels, c in per_client
            for ring, stats in c["rings"].items()
        ],
    )
    metric(
        "client_ring_wakeups_total",
        "counter",
        "Posts that woke each ring's consumer (outbox: the client; inbox: the daemon).",
        [
            (f'{labels},ring="{ring}"', stats["wakeups"])
            for labels, c in per_client
            for ring, stats in c["rings"].items()
        ],
    )
    waking = snap.get("waking") or {}
    per_step = [
        (f'{daemon},side="daemon"', (waking.get("daemon") or {}).get("wakeups_per_step")),
        (f'{daemon},side="clients"', waking.get("client_wakeups_per_step")),
    ]
    metric(
        "wakeups_per_step",
        "gauge",
        "Wake-ups per step since the daemon started (daemon: posts it received; "
        "clients: the daemon's posts to them, summed).",
        [(labels, v) for labels, v in per_step if v is not None],
    )
    held = snap["slab"]["held_by_client"] if snap["slab"] else {}
    metric(
        "client_slots_held",
        "gauge",
        "Slab slots each client holds.",
        [(f'{daemon},client="{k}"', v) for k, v in held.items()],
    )
    for name, text, counts, total in (
        ("step_seconds", "Engine step times.", snap["step_ns"], snap["step_sum_ns"]),
        (
            "delivery_seconds",
            "Chunk delivery, emitted by a step to pushed to its client.",
            snap["emitted_to_pushed"],
            snap["emitted_to_pushed_sum_ns"],
        ),
    ):
        out.append(f"# HELP {PREFIX}{name} {text}")
        out.append(f"# TYPE {PREFIX}{name} histogram")
        out.extend(_histogram(f"{PREFIX}{name}", daemon, np.asarray(counts), total))
    return "\n".join(out) + "\n"


def _histogram(name: str, labels: str, counts: np.ndarray[Any, Any], total_ns: int) -> list[str]:
    """Cumulative buckets at each power of two of the kept ones, then +Inf, sum, count."""
    cumulative = np.cumsum(counts)
    lines = []
    for index in range(0, latency.BUCKETS - 1, 4):
        edge = latency.upper_ns(index) / 1e9
        lines.append(f'{name}_bucket{{{labels},le="{edge:.9g}"}} {int(cumulative[index])}')
    count = int(cumulative[-1]) if len(cumulative) else 0
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {count}')
    lines.append(f"{name}_sum{{{labels}}} {_number(total_ns / 1e9)}")
    lines.append(f"{name}_count{{{labels}}} {count}")
    return lines


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return f"{value:.9g}" if isinstance(value, float) else str(int(value))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsServer(ThreadingHTTPServer):
    """An HTTP server with a listen queue of :data:`BACKLOG` whose connections
    :data:`WORKERS` threads answer (see the module's docstring)."""

    request_queue_size = BACKLOG
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        # before the bind: a port that is taken ends the bind in server_close, which
        # must find what it closes (no worker yet)
        self._waiting: queue.Queue[tuple[socket.socket, Any] | None] = queue.Queue(WAITING)
        self._workers: list[threading.Thread] = []
        super().__init__(address, handler)
        self._workers = [
            threading.Thread(target=self._work, name=f"rte-metrics-{i}", daemon=True)
            for i in range(WORKERS)
        ]
        for worker in self._workers:
            worker.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accepting thread: queue it for a worker, or say 503 and close."""
        try:
            self._waiting.put_nowait((request, client_address))
        except queue.Full:
            with contextlib.suppress(OSError):
                request.setblocking(False)  # a new socket's buffer takes these bytes
                request.send(BUSY)
            self.shutdown_request(request)

    def _work(self) -> None:
        while (item := self._waiting.get()) is not None:
            request, address = item
            try:
                self.finish_request(request, address)
            except Exception:
                self.handle_error(request, address)
            finally:
                self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper that went away mid-answer is not news: one debug line."""
        log.debug("metrics: a scrape from %s failed", client_address, exc_info=True)

    def server_close(self) -> None:
        """Close the socket, drop what waits, and end the workers."""
        super().server_close()
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._waiting.get_nowait()
                if item is not None:
                    self.shutdown_request(item[0])
        for _ in self._workers:
            self._waiting.put(None)
        for worker in self._workers:
            worker.join(REQUEST_TIMEOUT_S + 5.0)


def serve_metrics(name: str, port: int) -> MetricsServer:
    """Serve daemon ``name``'s metrics at ``/metrics`` on 127.0.0.1:``port`` (0: any
    free port; ``server.server_address`` says which) from daemon threads. Stop it
    with ``shutdown()`` then ``server_close()``."""

    class Metrics(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S

        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is here")
                return
            try:
                body = prometheus(snapshot(name)).encode()
            except Exception as exc:  # not READY yet, or stopping: say so, in one line
                self.send_error(503, f"{type(exc).__name__}: {exc}")
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return None  # a scrape every few seconds is not news

    server = MetricsServer(("127.0.0.1", port), Metrics)
    threading.Thread(target=server.serve_forever, name="rte-metrics", daemon=True).start()
    return server
