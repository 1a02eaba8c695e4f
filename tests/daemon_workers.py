"""Child-process bodies for the daemon tests."""

from __future__ import annotations

import random
import time
from typing import Any

from rte.client import Chunk, ShmClient
from rte.errors import EngineGone, RteError


def stream_forever(name: str, sessions: list[str], conn: Any) -> None:
    """Attach, tell the parent its client slot, then consume chunks until killed.

    A message from the parent makes it stop consuming: it takes and releases what it
    has taken already (down to an empty receive, so every credit is back with the
    daemon and nothing is held), answers "idle", and takes nothing more: the daemon's
    next chunks pile up in its outbox."""
    client = ShmClient(name, timeout=30)
    for session in sessions:
        client.attach(session)
    conn.send(client.index)
    while not conn.poll():
        chunk = client.poll(timeout=0.05)
        if chunk is not None:
            chunk.release()
    conn.recv()
    while (chunk := client.poll(timeout=0)) is not None:
        chunk.release()
    conn.send("idle")
    conn.recv()  # until killed


def chaos(name: str, seed: int, seconds: float) -> None:
    """Random client operations against daemon ``name`` for ``seconds``: valid and
    invalid attaches, actions, resets, detaches; chunks held and released; closes
    and reconnects. Refusals are expected and ignored; a gone daemon ends it."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    client: ShmClient | None = None
    held: list[Chunk] = []
    while time.monotonic() < deadline:
        try:
            if client is None:
                client = ShmClient(name, timeout=5)
                held = []
            op = rng.random()
            session = f"c{seed}-{rng.randrange(4)}"
            if op < 0.2:
                good = rng.random() < 0.7
                client.attach(session, {"move": (1, 0)} if good else {"mvoe": 1}, timeout=2)
            elif op < 0.45:
                good = rng.random() < 0.7
                client.act(
                    session, {"move": (0, 1)} if good else {"move": "x" * rng.randrange(1, 5000)}
                )
            elif op < 0.55:
                client.reset(session, None if rng.random() < 0.8 else {"prompt": 3}, timeout=2)
            elif op < 0.65:
                client.detach(session, timeout=2)
            elif op < 0.9:
                chunk = client.poll(timeout=0.02)
                if chunk is not None:
                    held.append(chunk)
                if held and rng.random() < 0.6:
                    held.pop(rng.randrange(len(held))).release()
                client.notices()
            else:
                client.close()
                client = None
        except EngineGone:
            return
        except RteError:
            continue
    if client is not None and rng.random() < 0.5:
        client.close()  # or just exit, leaving the daemon to reap it
