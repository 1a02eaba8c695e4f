"""Export: a session's state handed back to its client on every form (in process:
the state itself; through a daemon: written into a slot of the client's own input
segment, not through the ring), then attached elsewhere, going on as its twin."""

from __future__ import annotations

import numpy as np
import pytest
import test_client
from daemon_harness import take
from test_client import Engines, _frames_until

from rte.client import InProcessClient
from rte.composed import ComposedEngine
from rte.errors import RequestError
from rte.models import load_model
from rte.state import SessionState

engine = test_client.engine  # the fixture of the six client forms


def test_an_exported_session_goes_on_elsewhere_as_its_twin(engine: Engines) -> None:
    """Exported, a session leaves its engine; attached with that state on another
    engine, its chunk indices go on with no gap or repeat, its frames the twin's."""
    with InProcessClient(ComposedEngine(load_model("reference", max_sessions=1))) as alone:
        alone.attach("a", {"prompt": "forest"})
        twin = _frames_until(alone, {"a": 10})["a"]
    client = engine.client()
    client.attach("a", {"prompt": "forest"}, credits=1)
    before = _frames_until(client, {"a": 3})["a"]
    state = client.export("a")
    assert isinstance(state, SessionState)
    assert "a" not in client.sessions
    while (chunk := client.poll(timeout=0.3)) is not None:  # emitted before it left: still ours
        with chunk:
            assert chunk.chunk not in before, "a chunk came twice"
            before[chunk.chunk] = chunk.latent.copy()
    with pytest.raises(RequestError, match="'a' is not attached"):
        client.export("a")  # gone: nothing to export
    with InProcessClient(ComposedEngine(load_model("reference", max_sessions=1))) as there:
        there.attach("a", state=state)
        after = _frames_until(there, {"a": 10})["a"]
    frames = {**before, **after}
    assert sorted(frames) == list(range(11)), "a gap in its chunk indices"
    for index, frame in frames.items():
        np.testing.assert_array_equal(frame, twin[index], err_msg=f"chunk {index}")


def test_an_export_refused_leaves_the_others_as_they_were(engine: Engines) -> None:
    client = engine.client()
    client.attach("a")
    with pytest.raises(RequestError, match="'ghost' is not attached"):
        client.export("ghost")
    got = [c.chunk for c in take(client, "a", 3)]
    assert got == list(range(got[0], got[0] + 3)) and client.sessions == {"a"}
