"""Start and stop real daemons (``python -m rte serve``) for tests, and talk to
one as a raw client would (fault injection: records no honest client sends)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from rte.client import Chunk, EngineClient, ShmClient
from rte.launch import LaunchedDaemon
from rte.protocol.claims import ClaimTable
from rte.protocol.control import KIND_CLAIMS, KIND_CONTROL, KIND_MAILBOX, Control, DaemonState
from rte.protocol.mailbox import Mailbox
from rte.protocol.names import DaemonNames
from rte.protocol.wire import Bye, encode_request
from shm import Doorbell, Segment, process_start_time
from shm.names import SHM_DIR

TESTS = Path(__file__).resolve().parent


class DaemonProcess(LaunchedDaemon):
    """``rte serve --name NAME ARGS`` in a child process (tests/ on its path, for
    models the tests define): a :class:`~rte.launch.LaunchedDaemon` whose stop
    and kill leave its leftovers where they are (a test checks what the daemon
    itself removed), with what tests do to it besides."""

    def __init__(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
        super().__init__(name, args, env={**os.environ, "PYTHONPATH": path, **(env or {})})
        self.stderr = ""  # all it said, once stopped

    def client(self, timeout: float = 30.0) -> ShmClient:
        """A client once it is ready; AssertionError (its words) if it exited."""
        if self.process.poll() is not None:
            raise AssertionError(f"daemon exited with {self.process.returncode}: {self.said()}")
        client = self.connect(timeout)
        assert isinstance(client, ShmClient)
        return client

    def stop(self, timeout: float = 30.0, *, remove_leftovers: bool = False) -> int:
        """SIGTERM, wait; returns the exit code (kills it if it will not go)."""
        code = super().stop(timeout, remove_leftovers=remove_leftovers)
        self.stderr = self.said()
        return code

    def kill(self) -> int:
        code = super().kill()
        self.stderr = self.said()
        return code

    def burst(self, count: int = 300, sig: int = signal.SIGTERM) -> None:
        """``count`` signals as fast as they go (fewer if it exits meanwhile)."""
        for _ in range(count):
            if self.process.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


def take(client: EngineClient, session: str, n: int, timeout: float = 20.0) -> list[Chunk]:
    """The next ``n`` chunks of ``session`` (released; others are released and dropped)."""
    got: list[Chunk] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {[c.chunk for c in got]} of {n} of {session}"
        chunk = client.poll(timeout=1.0)
        if chunk is None:
            continue
        with chunk:
            if chunk.session == session:
                got.append(chunk)
    return got


class Deadline:
    """A loop's time limit: :meth:`check` fails the test once it has passed."""

    def __init__(self, seconds: float = 20.0, what: str = "the loop") -> None:
        self.seconds = seconds
        self.what = what
        self.end = time.monotonic() + seconds

    def check(self, detail: object = "") -> None:
        assert time.monotonic() < self.end, f"{self.what} took over {self.seconds}s {detail}"


def leftovers(name: str) -> list[str]:
    return DaemonNames(name).leftovers()


@contextlib.contextmanager
def running(name: str, *args: str, env: dict[str, str] | None = None) -> Iterator[DaemonProcess]:
    """``DaemonProcess(name, *args)`` for the block; after it, however it ends, the
    daemon must stop with exit 0."""
    daemon = DaemonProcess(name, *args, env=env)
    try:
        yield daemon
    finally:
        assert daemon.stop() == 0, daemon.stderr


@contextlib.contextmanager
def serving(*daemons: DaemonProcess) -> Iterator[list[DaemonProcess]]:
    """``daemons`` for a fixture to yield; after the block each one still running
    must stop with exit 0, and what each left (one a test killed) is removed."""
    started = list(daemons)
    yield started
    for d in started:
        if d.process.poll() is None:
            assert d.stop() == 0, d.stderr
        DaemonNames(d.name).remove_leftovers()


def ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie nobody reaped has ended too)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def slab_file(name: str) -> str:
    """The file in /dev/shm that holds daemon ``name``'s slab."""
    return str(SHM_DIR / DaemonNames(name).slab.lstrip("/"))


def mapped_file(address: int) -> str:
    """The file this process has mapped at ``address`` (from /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *rest = line.split()
            low, high = (int(x, 16) for x in span.split("-"))
            if low <= address < high:
                return rest[4] if len(rest) > 4 else ""
    raise AssertionError(f"{address:#x} is not mapped")


class RawClient:
    """A client slot of a live daemon, claimed as a client does (the control segment
    read-only, the claims writable, its own mailbox), with its ring pair:
    ``inbox.push`` sends any bytes at all; ``writable`` is every segment it maps
    writable (to scribble on)."""

    def __init__(self, name: str) -> None:
        names = DaemonNames(name)
        self.segment = Segment.open(names.control, kind=KIND_CONTROL, readonly=True)
        self.control = Control(self.segment)
        wait_for(lambda: self.control.state is DaemonState.READY, what="a ready daemon")
        layout = self.control.layout
        self.claims_segment = Segment.open(names.claims, kind=KIND_CLAIMS)
        self.claims = ClaimTable(self.claims_segment, layout.max_clients)
        me = os.getpid()
        claimed = self.claims.claim(me, process_start_time(me) or 0.0, self.control.table)
        assert claimed is not None, "no free client slot"
        index, generation = claimed
        self.index = index
        self.bell = Doorbell(names.bell)
        self.mailbox_segment = Segment.open(names.mailbox(index), kind=KIND_MAILBOX)
        self.mailbox = Mailbox.open(
            self.mailbox_segment,
            layout.ring_capacity,
            layout.handles,
            fresh=True,
            inbox_bell=self.bell,
        )
        self.inbox, self.outbox = self.mailbox.inbox, self.mailbox.outbox
        self.mailbox.clear(time.monotonic_ns())
        assert self.claims.activate(index, generation)
        self.bell.ring()
        self.writable = [self.claims_segment, self.mailbox_segment]

    def close(self) -> None:
        """Say BYE (the daemon frees the slot) and unmap."""
        self.inbox.push(encode_request(Bye()), timeout=5)
        self.bell.close()
        for segment in (self.mailbox_segment, self.claims_segment, self.segment):
            segment.close()


def wait_for(
    predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
