"""Child-process bodies for the daemon tests."""

from __future__ import annotations

from typing import Any

from rte.client import ShmClient


def stream_forever(name: str, sessions: list[str], conn: Any) -> None:
    """Attach, tell the parent its client slot, then consume chunks until killed."""
    client = ShmClient(name, timeout=30)
    for session in sessions:
        client.attach(session)
    conn.send(client.index)
    while True:
        chunk = client.poll(timeout=1.0)
        if chunk is not None:
            chunk.release()
