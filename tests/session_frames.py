"""A moved session's frames, gathered by chunk index (tests/test_host_state.py,
tests/test_ray_migrate.py): each chunk once, so a move that repeats one, or
loses the stream, fails where it happens."""

from __future__ import annotations

from typing import Any

from daemon_harness import Deadline

from rte.client import EngineClient


def frames_until(
    client: EngineClient,
    frames: dict[int, Any],
    until: int,
    applied: dict[int, int] | None = None,
    what: str = "the session's frames",
) -> None:
    """The frames of ``client``'s chunks (its one session's) into ``frames`` by chunk
    index, each latent copied (and each chunk's ``applied`` into ``applied``), until
    chunk ``until`` came: 20 s at most, and a chunk that comes twice fails."""
    limit = Deadline(what=what)
    while until not in frames:
        limit.check(sorted(frames))
        chunk = client.poll(timeout=1.0)
        if chunk is not None:
            with chunk:
                assert chunk.chunk not in frames, f"chunk {chunk.chunk} came twice"
                frames[chunk.chunk] = chunk.latent.copy()
                if applied is not None:
                    applied[chunk.chunk] = chunk.applied
