"""The daemon as a process: ``rte serve --name NAME`` runs :func:`serve`
(through :mod:`rte.cli.foreground`, which says on stderr what happens).

This module owns the process's life, nothing else (it prints nothing):

- **signals first**: SIGTERM/SIGINT are handled before anything is created, and
  the handler only writes a byte to a pipe (:mod:`rte.ipc.signals`: a thread
  sets the flag and rings the doorbell), so a signal at any moment, or a burst
  of them, leaves nothing behind and exits cleanly;
- **the model's load** runs on a thread of its own: a stop during a load of
  minutes ends the daemon at once (nothing is created before the model is);
- **the name**: a :class:`~shm.lock.NameLock` makes one process at a time
  the owner of NAME; a live owner is refused (:class:`DaemonRunningError`),
  a dead one's leftovers are removed;
- **resources in an exit stack**: the control segment, the claims, each client
  slot's mailbox (its rings) and input segment, the slab and the doorbells are
  created in order and each registers its own undoing, so
  any failure part-way, and every normal stop, unlinks exactly what exists;
- **the worker thread**: :class:`~rte.ipc.core.DaemonCore` runs on it for the
  engine's whole life; the main thread waits for it and reports its failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from typing import TypeVar

from rte.contract import Manifest
from rte.errors import ConfigurationError, DaemonRunningError, EngineFault
from rte.ipc import figures
from rte.ipc.core import DaemonCore, Shared
from rte.ipc.metrics import serve_metrics
from rte.ipc.settings import Settings
from rte.ipc.signals import StopSignals
from rte.models import load_model
from rte.protocol import inputs as input_slab
from rte.protocol.control import (
    KIND_CLAIMS,
    KIND_CONTROL,
    KIND_FIGURES,
    KIND_INPUTS,
    KIND_MAILBOX,
    KIND_SLAB,
    Control,
    DaemonState,
    Layout,
)
from rte.protocol.mailbox import Mailbox
from rte.protocol.names import DaemonNames
from rte.stages import StageModel
from shm import Doorbell, Segment, SegmentError, ShmError, Slab
from shm.fifo import FifoBell
from shm.lock import NameLock, NameLockHeld
from shm.segment import HEADER_SIZE

log = logging.getLogger("rte.daemon")
STOP_TIMEOUT_S = 30.0
_Owned = TypeVar("_Owned", Segment, Doorbell, FifoBell)


def serve(
    settings: Settings,
    *,
    ready: Callable[[str], None] | None = None,
    restore_signals: bool = True,
) -> None:
    """Run a daemon in this process (its main thread) until SIGTERM/SIGINT.

    ``ready`` is told one line once clients may connect. With
    ``restore_signals`` False both signals are ignored after the return (a
    process about to exit: a late signal must not end it another way). Raises
    DaemonRunningError when a live daemon owns the name, ConfigurationError
    when the model cannot be loaded; re-raises what ended the serve loop,
    after everything was cleaned up.
    """
    stopping = threading.Event()
    bells: list[Doorbell] = []
    names = settings.names
    core: DaemonCore | None = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(StopSignals(stopping, lambda: _ring(bells), restore=restore_signals))
        stack.callback(stopping.set)  # whatever ends this block ends the loop too
        stack.enter_context(_own_name(names))
        model = _load_until_stopped(settings, stopping)
        if model is None or stopping.is_set():
            return
        manifest = model.manifest()  # (times --engines: each engine has its rows)
        settings.check_memory(manifest.latent_nbytes)  # before anything is made
        shared = _create(
            stack,
            settings,
            dataclasses.replace(manifest, max_sessions=manifest.max_sessions * settings.engines),
        )
        bells.append(shared.bell)
        stack.callback(bells.clear)  # before the bell is closed: a late signal rings nothing
        core = DaemonCore(settings, shared, model, load=lambda: _load(settings))
        pinned = _pin(shared.slab, core.engine.lanes.device)
        if pinned:
            stack.callback(_unpin, shared.slab, core)  # after the worker ended: no copy in flight
        metrics = ""
        if settings.metrics_port is not None:  # before the worker: a taken port stops us here
            server = _metrics_server(names.daemon, settings.metrics_port)
            stack.callback(server.server_close)
            stack.callback(server.shutdown)  # first: no scrape reads a closed segment
            metrics = f" metrics=http://127.0.0.1:{server.server_address[1]}/metrics"
        worker = threading.Thread(target=core.run, args=(stopping,), name="rte-engine", daemon=True)
        shared.control.set_state(DaemonState.READY)
        worker.start()
        if ready is not None:
            m = shared.control.manifest()  # what clients see: rows of every engine
            rows = f" (--engines {settings.engines} x --max-sessions {manifest.max_sessions})"
            pace = f"{settings.pace_hz:g}Hz" if settings.pace_hz else "unpaced"
            handles = (
                f" sessions_per_client={settings.handles}"
                if settings.handles != m.max_sessions
                else ""
            )
            ready(
                f"ready name={names.daemon} pid={os.getpid()} model={m.model} "
                f"max_sessions={m.max_sessions}{rows if settings.engines > 1 else ''} "
                f"pace={pace} max_clients={settings.max_clients}{handles} "
                f"lanes={core.engine.lanes.kind} device={core.engine.lanes.device} "
                f"slab_pinned={pinned}{metrics}"
            )
        while worker.is_alive() and not stopping.is_set():
            worker.join(0.2)
        worker.join(STOP_TIMEOUT_S)  # it finalizes every session first
        if worker.is_alive():
            log.error("the serve loop did not stop in %gs; cleaning up under it", STOP_TIMEOUT_S)
    if core is not None and core.failure is not None:
        raise core.failure


def _ring(bells: list[Doorbell]) -> None:
    """Wake the loop to see that it is stopping."""
    for bell in list(bells):
        with contextlib.suppress(Exception):  # a bell closed under us: nobody to wake
            bell.ring()


def _metrics_server(name: str, port: int) -> ThreadingHTTPServer:
    try:
        return serve_metrics(name, port)
    except OSError as exc:  # the port is taken, or not ours to take
        raise ConfigurationError(f"--metrics-port {port}: {exc.strerror or exc}") from None


def _pin(slab: Slab, device: str) -> bool:
    """Page-lock the slab for the GPU's copies when the model computes on one. A
    refusal is said and the daemon serves unpinned (slower copies from the GPU):
    the pin is a speed-up, never a reason not to serve."""
    if not device.startswith("cuda:"):
        return False
    try:
        return slab.pin(int(device.partition(":")[2]))
    except Exception as exc:  # SegmentError from CUDA, or a torch that cannot pin at all
        log.warning(
            "the slab %s is not page-locked, serving unpinned (copies from the GPU go "
            "through a staging buffer): %s: %s",
            slab.segment.name,
            type(exc).__name__,
            exc,
        )
        return False


def _unpin(slab: Slab, core: DaemonCore) -> None:
    """Unpin the slab; after a device failure, CUDA may refuse: that is said, not raised
    (the device's failure is what the daemon reports)."""
    try:
        slab.unpin()
    except SegmentError as exc:
        if not isinstance(core.failure, EngineFault):
            raise
        log.warning("%s", exc)


def _load_until_stopped(settings: Settings, stopping: threading.Event) -> StageModel | None:
    """The model, loaded on a thread of its own so that a stop (SIGTERM, SIGINT)
    during a long load ends the daemon at once: None then (nothing was created
    yet; the load is left to die with the process). What the load raises is
    raised here."""
    done: list[StageModel] = []
    failed: list[BaseException] = []
    finished = threading.Event()

    def load() -> None:
        try:
            done.append(_load(settings))
        except BaseException as exc:  # handed to the main thread, raised there
            failed.append(exc)
        finally:
            finished.set()

    threading.Thread(target=load, name="rte-load", daemon=True).start()
    while not finished.wait(0.05):  # (ready the moment it is loaded; a stop within 50 ms)
        if stopping.is_set():
            break
    if not finished.is_set():
        log.info("stopped while the model was loading (%s): nothing was created", settings.model)
        return None
    if failed:
        raise failed[0]
    return done[0]


def _load(settings: Settings) -> StageModel:
    extra = dict(settings.model_settings or {})
    device = settings.device
    if device is not None:
        if device != "cpu":
            _check_cuda(device)
        extra["device"] = device
    try:
        try:
            model = load_model(settings.model, max_sessions=settings.max_sessions, **extra)
        except TypeError as exc:  # a model that takes no device computes on the CPU
            if device != "cpu" or "device" not in str(exc):
                raise
            del extra["device"]
            model = load_model(settings.model, max_sessions=settings.max_sessions, **extra)
    except TypeError as exc:
        if "device" in extra and "device" in str(exc):
            raise ConfigurationError(
                f"--device {device}: model {settings.model} computes on the CPU; "
                "a GPU needs a torch model (--model torch)"
            ) from None
        raise ConfigurationError(f"--model {settings.model}: {exc}") from None
    except (ValueError, ImportError, AttributeError) as exc:
        raise ConfigurationError(f"--model {settings.model}: {exc}") from None
    where = str(getattr(model, "device", "cpu"))
    if (
        device is not None
        and where != device
        and not (device == "cuda" and where.startswith("cuda"))
    ):
        raise ConfigurationError(f"--device {device}: model {settings.model} went to {where}")
    return model


def _check_cuda(device: str) -> None:
    """ConfigurationError unless torch sees the CUDA device ``device``."""
    try:
        import torch  # noqa: PLC0415 (only for a CUDA device)
    except ImportError:
        raise ConfigurationError(
            f"--device {device}: needs torch; install the extra: pip install -e '.[torch]'"
        ) from None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        raise ConfigurationError(
            f"--device {device}: torch sees {count} CUDA device{'s' if count != 1 else ''} here"
        )


@contextlib.contextmanager
def _own_name(names: DaemonNames) -> Iterator[None]:
    """Hold the daemon's name for the process's life; replace a dead owner's leftovers."""
    try:
        lock = NameLock(names.lock)
    except NameLockHeld:
        raise DaemonRunningError(_running_message(names)) from None
    with lock:
        removed = names.unlink_unlocked()
        if removed:
            log.warning("replaced the leftovers of a dead daemon: %s", ", ".join(removed))
        yield


def _running_message(names: DaemonNames) -> str:
    name = names.daemon
    try:
        with Segment.open(names.control, kind=KIND_CONTROL, readonly=True) as segment:
            pid = segment.creator_pid
    except ShmError:
        return f"a daemon named {name!r} is starting; wait for it or choose another --name"
    return (
        f"a daemon named {name!r} is already running (pid {pid}); stop it (kill {pid}) "
        "or choose another --name"
    )


def _create(stack: contextlib.ExitStack, settings: Settings, manifest: Manifest) -> Shared:
    """Create every shared object, each undone by ``stack`` (last made, first gone)."""
    names, n = settings.names, settings.max_clients
    layout = Layout(n, settings.ring_capacity, settings.handles)  # handles: per client
    segment = _owned(stack, Segment.create(names.control, layout.size, kind=KIND_CONTROL))
    claims = _owned(stack, Segment.create(names.claims, layout.claims_size, kind=KIND_CLAIMS))
    mailboxes = []  # each client slot's rings and credits, in a segment of its own
    for i in range(n):
        mine = Segment.create(names.mailbox(i), layout.mailbox_size, kind=KIND_MAILBOX)
        mailboxes.append(
            Mailbox.create(_owned(stack, mine), settings.ring_capacity, layout.handles)
        )
    control = Control.initialise(segment, layout, manifest, claims, mailboxes)
    slab_bytes = settings.segment_bytes(manifest.latent_nbytes)["slab"]  # as check_memory asked
    slab_segment = _owned(stack, Segment.create(names.slab, slab_bytes, kind=KIND_SLAB))
    slab = Slab.create(
        slab_segment,
        HEADER_SIZE,
        slots=settings.slab_slot_count,
        slot_bytes=manifest.latent_nbytes,
        max_owners=n,
        quota=settings.client_quota,
    )
    figures_bytes = HEADER_SIZE + n * figures.size(layout.handles)
    board = _owned(stack, Segment.create(names.figures, figures_bytes, kind=KIND_FIGURES))
    bell = _owned(stack, Doorbell(names.bell, create=True))
    client_bells = [_owned(stack, Doorbell(names.client_bell(i), create=True)) for i in range(n)]
    client_wakes = [_owned(stack, FifoBell(names.client_wake(i), create=True)) for i in range(n)]
    inputs = []  # each client's share of the input slots, in a segment of its own
    if settings.input_slab_slots:
        share, slot_bytes = settings.input_slab_slots // n, settings.input_slot_kib * 1024
        size = input_slab.segment_bytes(share, slot_bytes)
        for i in range(n):
            mine = Segment.create(names.client_inputs(i), size, kind=KIND_INPUTS)
            inputs.append(input_slab.create_slab(_owned(stack, mine), share, slot_bytes))
    return Shared(segment, control, slab, bell, client_bells, client_wakes, inputs, board)


def _owned(stack: contextlib.ExitStack, thing: _Owned) -> _Owned:
    """Register ``thing``'s close and unlink with ``stack``; return it."""

    @stack.callback
    def undo() -> None:
        for step in (thing.close, thing.unlink):  # each on its own: an unlink never skipped
            try:
                step()
            except Exception as exc:  # cleanup goes on past one failure
                log.warning("cleanup of %s failed: %s", thing.name, exc)

    return thing
