"""A pool client in a process of its own, for tests/test_drain.py: ``python
drain_worker.py SPEC`` (SPEC a JSON object: ``names``, the pool's daemons;
``sessions``, to attach; ``on``, a daemon one of them must live on; ``stop``, a
file whose appearance ends it; ``out``, where its findings go).

It attaches its sessions (moving one onto ``on`` if placement put none there),
says ``ready`` with their homes on stdout, then streams until ``stop`` appears
(or its own deadline), releasing every chunk at once. Its findings, as JSON:
each session's chunks as ``{index: sha256 of the frame}`` (a repeat is
recorded), where each lives at the end, and the notices it saw.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from rte.client import connect_pool

DEADLINE_S = 60.0


def main(spec: dict[str, object]) -> None:
    names = list(spec["names"])  # type: ignore[call-overload]
    sessions = list(spec["sessions"])  # type: ignore[call-overload]
    frames: dict[str, dict[int, str]] = {s: {} for s in sessions}
    repeats: list[str] = []
    notices: list[list[object]] = []
    with connect_pool(names, timeout=30) as client:
        for session in sessions:
            client.attach(session, {"prompt": "forest"})
        if all(client.home[s] != spec["on"] for s in sessions):
            client.migrate(sessions[0], to=str(spec["on"]))
        print(json.dumps({"ready": {s: client.home[s] for s in sessions}}), flush=True)
        end = time.monotonic() + DEADLINE_S
        while not os.path.exists(str(spec["stop"])) and time.monotonic() < end:
            chunk = client.poll(timeout=0.2)
            if chunk is not None:
                with chunk:
                    seen = frames[chunk.session]
                    if chunk.chunk in seen:
                        repeats.append(f"{chunk.session}:{chunk.chunk}")
                    seen[chunk.chunk] = hashlib.sha256(chunk.latent.tobytes()).hexdigest()
            notices += [[n.session, n.kind.name, n.message] for n in client.notices()]
        homes = {s: client.home.get(s, "") for s in sessions}
    found = {"frames": frames, "repeats": repeats, "homes": homes, "notices": notices}
    with open(str(spec["out"]), "w") as out:
        json.dump(found, out)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
