"""What a daemon's settings cost in shared memory, asked before anything is made.

A daemon makes three kinds of segment: the slab its chunks are written into,
the control segment (its table, claims, mailboxes and every client's ring
pair, with the session figures: both sized by each client's session handles,
``--sessions-per-client``) and, when it takes inputs by slot, one input
segment per client. Their sizes follow from the
:class:`~rte.ipc.settings.Settings` and the model's chunk size alone, so
:func:`check_memory` can refuse, once the model is loaded and before anything
is created, settings whose segments ``/dev/shm`` has no room for, naming the
options that shrink the largest one. (Creating a segment past the free space
fails too, each being fully backed, but only for that one, after others were
made, and without saying which option to lower.)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from rte.errors import ConfigurationError
from rte.ipc import figures
from rte.protocol import inputs as input_slab
from rte.protocol.control import Layout
from shm import Slab
from shm.names import SHM_DIR
from shm.segment import HEADER_SIZE

if TYPE_CHECKING:
    from rte.ipc.settings import Settings


def segment_bytes(settings: Settings, chunk_bytes: int) -> dict[str, int]:
    """The bytes of each shared segment ``settings`` make, for chunks of
    ``chunk_bytes`` (the model's manifest says: ``latent_nbytes``)."""
    n = settings.max_clients
    slab = Slab.footprint(HEADER_SIZE, settings.slab_slot_count, chunk_bytes, n)
    sizes = {
        "slab": HEADER_SIZE + slab,
        "control": Layout(n, settings.ring_capacity, settings.handles).shared_bytes
        + HEADER_SIZE
        + n * figures.size(settings.handles),
    }
    share = settings.input_slab_slots // n
    if share:  # each client's share in a segment of its own
        slot_bytes = settings.input_slot_kib * 1024
        sizes["inputs"] = n * input_slab.segment_bytes(share, slot_bytes)
    return sizes


def check_memory(settings: Settings, chunk_bytes: int, free: int | None = None) -> None:
    """ConfigurationError when the segments need more than ``free`` bytes
    (None: what ``/dev/shm`` has free), saying which options to lower."""
    if free is None:
        try:
            stat = os.statvfs(SHM_DIR)
        except OSError:  # no /dev/shm to ask: creating the segments will say
            return
        free = stat.f_bavail * stat.f_frsize
    sizes = segment_bytes(settings, chunk_bytes)
    total = sum(sizes.values())
    if total <= free:
        return
    largest = max(sizes, key=sizes.__getitem__)
    also = ", --engines" if settings.engines > 1 else ""
    if settings.sessions_per_client is not None:
        also += ", --sessions-per-client"
    fix = {
        "slab": f"fewer --max-clients, --max-sessions{also} "
        f"or --credits (the slab holds {settings.slab_slot_count:,} chunks of "
        f"{chunk_bytes:,} B: every client's sessions' credits)",
        "control": "fewer --max-clients, a smaller --ring-kib or fewer --sessions-per-client",
        "inputs": f"fewer --input-slots ({settings.input_slab_slots:,}) or a smaller "
        "--input-slot-kib (--input-slots 0: none)",
    }[largest]
    parts = ", ".join(f"{part} {_size(size)}" for part, size in sizes.items())
    raise ConfigurationError(
        f"these settings need {_size(total)} of shared memory ({parts}) but {SHM_DIR} "
        f"has {_size(free)} free; ask for {fix}, or make {SHM_DIR} larger "
        "(Docker: --shm-size)"
    )


def _size(n: int) -> str:
    """``n`` bytes for people: 12.0 KiB, 2.4 TiB."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    exponent = 0
    while n >= 1024 ** (exponent + 1) and exponent < len(units) - 1:
        exponent += 1
    return f"{n / 1024**exponent:.1f} {units[exponent]}"
