"""rte inspect reads live, hung and dead daemons without disturbing them."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import daemon_workers
import pytest
from daemon_harness import DaemonProcess, wait_for

from rte.cli import main as rte_main
from rte.cli.inspect import fit
from rte.protocol.names import DaemonNames
from shm import Segment
from shm.names import SHM_DIR

SPAWN = multiprocessing.get_context("spawn")


def run(*argv: str) -> str:
    """What ``rte inspect ARGV`` prints, run in this process (it must return 0)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert rte_main(["inspect", *argv]) == 0
    return out.getvalue()


def shm_bytes(name: str) -> dict[str, bytes]:
    """The bytes of every segment of daemon ``name`` (its FIFOs hold none: never read)."""
    files = [SHM_DIR / n.lstrip("/") for n in DaemonNames(name).leftovers()]
    return {f.name: f.read_bytes() for f in files if f.is_file()}


@pytest.fixture
def loaded(
    shm_prefix: str,
) -> Iterator[tuple[DaemonProcess, multiprocessing.process.BaseProcess, int, Connection]]:
    d = DaemonProcess(shm_prefix, "--max-clients", "2")
    parent, child = SPAWN.Pipe()
    streamer = SPAWN.Process(
        target=daemon_workers.stream_forever, args=(shm_prefix, ["a", "b"], child)
    )
    streamer.start()
    assert parent.poll(30)
    index = parent.recv()
    yield d, streamer, index, parent
    for pid in (d.pid, streamer.pid):
        assert pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    streamer.kill()
    streamer.join(10)
    assert d.stop() == 0, d.stderr


def test_inspect_changes_nothing_even_on_a_frozen_daemon(
    loaded: tuple[DaemonProcess, multiprocessing.process.BaseProcess, int, Connection],
) -> None:
    daemon, streamer, index, streaming = loaded
    assert streamer.pid is not None
    wait_for(lambda: json.loads(run(daemon.name, "--json"))["counters"]["chunks"] > 50)
    # The client stops consuming with every credit given back (a client frozen at a
    # random instant may hold them all, having taken every record: then nothing
    # piles up), so the daemon's next chunks wait in its outbox.
    streaming.send("stop")
    assert streaming.poll(30) and streaming.recv() == "idle"
    os.kill(streamer.pid, signal.SIGSTOP)
    wait_for(lambda: waiting(daemon.name) > 0, what="records waiting in the outbox")
    os.kill(daemon.pid, signal.SIGSTOP)  # and the daemon hangs
    time.sleep(0.1)
    before = shm_bytes(daemon.name)
    listing = run()
    detail = json.loads(run(daemon.name, "--json"))
    text = run(daemon.name)
    rings = run(daemon.name, "--ring", str(index))
    assert shm_bytes(daemon.name) == before  # not one byte moved
    assert daemon.name in listing and "alive" in listing
    (client,) = detail["clients"]
    assert client["index"] == index and client["sessions"] == 2 and client["alive"]
    assert client["rings"]["outbox"]["waiting"] > 0
    assert detail["slab"]["held_by_client"][str(index)] > 0
    assert detail["summary"]["heartbeat_age_s"] >= 0.05
    assert "outbox" in text and "slab" in text and "counters" in text
    holders = text[text.index("HOLDER") :].splitlines()  # a table, not a Python dict
    assert holders[1].split() == ["client", str(index), str(client_slots(detail, index))]
    assert "STEP 2 chunks, handles=[" in rings  # one record per step: both sessions


def waiting(name: str) -> int:
    (client,) = json.loads(run(name, "--json"))["clients"]
    return int(client["rings"]["outbox"]["waiting"])


def client_slots(detail: dict[str, Any], index: int) -> int:
    return int(detail["slab"]["held_by_client"][str(index)])


def test_the_mapping_is_read_only_by_construction(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix)
    try:
        d.client().close()
        segment = Segment.open(DaemonNames(shm_prefix).control, readonly=True)
        with pytest.raises(TypeError):
            segment.bytes_at(4096, 8)[0] = 1
        segment.close()
    finally:
        assert d.stop() == 0


def test_a_dead_daemon_is_listed_as_stale_with_the_command_that_removes_it(
    shm_prefix: str,
) -> None:
    d = DaemonProcess(shm_prefix)
    try:
        client = d.client()
        client.attach("x")
        d.kill()
        listing = run()
        line = next(line for line in listing.splitlines() if line.startswith(shm_prefix))
        assert "DEAD" in line
        assert f"rte inspect {shm_prefix} --remove" in listing
        detail = json.loads(run(shm_prefix, "--json"))
        assert detail["summary"]["alive"] is False
        assert "state DEAD" in run(shm_prefix)  # not the READY its state word still says
        client.close()
        assert "removed" in run(shm_prefix, "--remove")  # the command it showed
        assert DaemonNames(shm_prefix).leftovers() == []
    finally:
        DaemonNames(shm_prefix).remove_leftovers()
    assert shm_prefix not in run()


def test_a_live_daemon_is_never_removed(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix)
    try:
        d.client().close()
        out = io.StringIO()
        with contextlib.redirect_stderr(out):
            assert rte_main(["inspect", shm_prefix, "--remove"]) == 1
        assert "is alive" in out.getvalue()
        with d.client() as client:  # untouched
            client.attach("x")
            assert client.poll(timeout=10) is not None
    finally:
        assert d.stop() == 0


def test_ring_of_a_free_slot_and_watch_as_json_lines(shm_prefix: str) -> None:
    d = DaemonProcess(shm_prefix, "--max-clients", "4")
    try:
        with d.client() as client:
            client.attach("x")
            done = subprocess.run(
                [sys.executable, "-m", "rte", "inspect", shm_prefix, "--ring", "3"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
            assert f"no client in slot 3 of {shm_prefix!r}: it is free" in done.stderr
            command = [sys.executable, "-m", "rte", "inspect", shm_prefix, "--watch"]
            watch = subprocess.Popen(
                [*command, "--json", "--interval", "0.1"],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert watch.stdout is not None
            lines = [watch.stdout.readline() for _ in range(3)]
            watch.send_signal(signal.SIGINT)
            assert watch.wait(30) == 0
            watch.stdout.close()
        snapshots = [json.loads(line) for line in lines]  # one object per line
        assert all(snap["name"] == shm_prefix for snap in snapshots)
    finally:
        assert d.stop() == 0


def test_watch_fits_the_terminal() -> None:
    text = "short\n" + "x" * 200
    assert fit(text, 80).splitlines() == ["short", "x" * 79 + "…"]


def test_prometheus_exposition_parses_and_counts_what_the_daemon_did(shm_prefix: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    d = DaemonProcess(shm_prefix, "--model", "null")
    try:
        with d.client() as client:
            client.attach("a")
            for _ in range(20):
                chunk = client.poll(timeout=10)
                assert chunk is not None
                chunk.release()
            # the counters are written every millisecond: wait out that lag
            wait_for(lambda: json.loads(run(shm_prefix, "--json"))["counters"]["chunks"] >= 20)
            text = run(shm_prefix, "--prometheus")
            index = client.index
    finally:
        assert d.stop() == 0
    families = {f.name: f for f in text_string_to_metric_families(text)}
    value = {f.name: f.samples[0].value for f in families.values() if f.type != "histogram"}
    assert value["rte_up"] == 1 and value["rte_sessions"] == 1 and value["rte_clients"] == 1
    assert families["rte_chunks"].type == "counter"  # (the parser drops _total)
    assert value["rte_chunks"] >= 20 and value["rte_steps"] >= 20
    (sessions,) = families["rte_client_sessions"].samples
    assert sessions.labels == {"daemon": shm_prefix, "client": str(index)} and sessions.value == 1
    rings = {s.labels["ring"] for s in families["rte_client_ring_used_bytes"].samples}
    assert rings == {"inbox", "outbox"}
    for name in ("rte_step_seconds", "rte_delivery_seconds"):
        samples = families[name].samples
        buckets = [s.value for s in samples if s.name.endswith("_bucket")]
        count = next(s.value for s in samples if s.name.endswith("_count"))
        total = next(s.value for s in samples if s.name.endswith("_sum"))
        assert buckets == sorted(buckets) and buckets[-1] == count >= 20 and total > 0


def test_serve_metrics_port_serves_the_same_on_loopback(shm_prefix: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    d = DaemonProcess(shm_prefix, "--model", "null", "--metrics-port", "0")
    try:
        with d.client() as client:
            client.attach("a")
            assert client.poll(timeout=10) is not None
            (url,) = re.findall(r"metrics=(http://127\.0\.0\.1:\d+/metrics)", d.said())
            with urllib.request.urlopen(url, timeout=10) as answer:
                assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                text = answer.read().decode()
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=10)
    finally:
        assert d.stop() == 0
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["rte_up"].samples[0].value == 1
    assert families["rte_sessions"].samples[0].value == 1
    with pytest.raises(urllib.error.URLError):  # gone with the daemon
        urllib.request.urlopen(url, timeout=10)


def test_an_idle_daemons_counters_count_every_step_it_made(shm_prefix: str) -> None:
    """The counters are written every millisecond while the daemon works, and
    once more before it sleeps: the steps just before a sleep are not missing."""
    d = DaemonProcess(shm_prefix, "--model", "null")
    try:
        with d.client() as client:
            client.attach("a", credits=1)
            received = 0
            for _ in range(30):  # steps a client round trip apart: many per millisecond
                chunk = client.poll(timeout=10)
                assert chunk is not None
                chunk.release()
                received += 1
            held = client.poll(timeout=10)  # held: the daemon can step no more, and sleeps
            assert held is not None
            time.sleep(0.3)
            counters = json.loads(run(shm_prefix, "--json"))["counters"]
            assert counters["chunks"] >= received + 1 and counters["steps"] >= received + 1
            held.release()
    finally:
        assert d.stop() == 0


def test_two_hundred_scrapes_at_once_are_all_answered_by_a_few_threads(
    shm_prefix: str,
) -> None:
    """A burst of scrapes waits in the listen queue, never in the kernel's SYN retries
    (1 s, 3 s, 7 s...: some waited a minute with a queue of 5), and is served by a
    bounded set of threads, not a thread per connection."""
    import asyncio  # noqa: PLC0415

    import psutil  # noqa: PLC0415

    d = DaemonProcess(shm_prefix, "--model", "null", "--metrics-port", "0")
    try:
        d.client().close()  # ready
        (port,) = re.findall(r"metrics=http://127\.0\.0\.1:(\d+)/metrics", d.said())
        daemon = psutil.Process(d.pid)
        before = daemon.num_threads()
        most = [before]

        async def scrape() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
            writer.write(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            answer = await reader.read()
            writer.close()
            return answer

        async def count_threads(done: asyncio.Event) -> None:
            while not done.is_set():
                most[0] = max(most[0], daemon.num_threads())
                await asyncio.sleep(0.01)

        async def burst() -> list[bytes]:
            done = asyncio.Event()
            counting = asyncio.create_task(count_threads(done))
            try:
                return await asyncio.wait_for(asyncio.gather(*(scrape() for _ in range(200))), 20)
            finally:
                done.set()
                await counting

        answers = asyncio.run(burst())
    finally:
        assert d.stop() == 0
    assert all(a.startswith(b"HTTP/1.0 200 ") for a in answers), {a[:40] for a in answers}
    assert most[0] - before <= 8, f"{most[0] - before} threads more for 200 scrapes"


def test_past_the_bound_a_scrape_is_refused_at_once_not_given_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Connections that never send their request fill the workers and the queue:
    the next scrape is a 503 at once, and no thread is added for any of them."""
    import socket  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from rte.ipc import metrics  # noqa: PLC0415

    monkeypatch.setattr(metrics, "WAITING", 2)
    server = metrics.serve_metrics("nosuch", 0)
    port = server.server_address[1]
    threads = threading.active_count()
    idle: list[socket.socket] = []
    try:
        for _ in range(metrics.WORKERS + 2):  # each holds a worker or a place in the queue
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        deadline, answer = time.monotonic() + 10, b""
        while not answer.startswith(b"HTTP/1.0 503 "):
            assert time.monotonic() < deadline, f"no 503 past the bound: {answer!r}"
            probe = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(probe)  # (one that waits holds a place too, until we close it)
            probe.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            probe.settimeout(0.3)
            with contextlib.suppress(TimeoutError):
                answer = probe.recv(4096)
        assert b"Content-Length: 0" in answer, answer
        assert threading.active_count() == threads, "a thread per connection"
    finally:
        for connection in idle:
            connection.close()
        server.shutdown()
        server.server_close()
