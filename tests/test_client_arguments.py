"""Every argument of every public client call is checked, the same way on every form.

A bad session id, credits, conditioning, timeout or row is a RequestError that
names it (never a ``struct.error``, ``OverflowError`` or ``TypeError`` from inside
the client, never a hang on a nan), and nothing changed: the client streams on.
Runs on the form matrix of test_client.py (in process, shared memory, and each on
an asyncio loop); the checks are the client's, so on CPU lanes only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from daemon_harness import take
from test_client import Engines, engine  # noqa: F401  (the form matrix fixture)

from rte import RequestError
from rte.client import EngineClient

BAD_SESSIONS: list[Any] = [5, None, b"s", ("s",), "x\ud800", "x" * 300]
BAD_CREDITS: list[Any] = [1.5, True, -1, 256, 10**30, "2", None]
BAD_TIMEOUTS: list[Any] = [-1, math.nan, math.inf, 1e300, "1", True, None]
BAD_CONDITIONING: list[Any] = [5, "prompt", [("prompt", "p")]]


@pytest.fixture
def each_lanes() -> str:
    return "cpu"  # (overrides conftest's: these checks run before any lane)


def refused(says: str, call: Callable[..., object], *args: Any, **kwargs: Any) -> None:
    with pytest.raises(RequestError) as caught:
        call(*args, **kwargs)
    assert says in str(caught.value), caught.value


def still_serves(client: EngineClient, attached: set[str]) -> None:
    assert client.sessions == attached and client.held() == 0
    client.attach("after")
    assert take(client, "after", 2)


def test_bad_session_ids_are_refused_by_every_call(engine: Engines) -> None:  # noqa: F811
    client = engine.client()
    client.attach("ok")
    for bad in BAD_SESSIONS:
        refused("session id", client.attach, bad)
        refused("session id", client.act, bad, {"prompt": "p"})
        refused("session id", client.reset, bad)
        refused("session id", client.detach, bad)
    refused("not valid UTF-8", client.attach, "x\ud800")
    refused("a session id is a str, not int", client.attach, 5)
    still_serves(client, {"ok"})


def test_bad_credits_are_refused_before_anything_is_sent(engine: Engines) -> None:  # noqa: F811
    client = engine.client()
    for bad in BAD_CREDITS:
        refused("credits", client.attach, "s", credits=bad)
    refused("whole number", client.attach, "s", credits=1.5)
    refused("credits 256: must be 1 to 255", client.attach, "s", credits=256)
    still_serves(client, set())


def test_bad_timeouts_are_refused_by_every_call_that_waits(engine: Engines) -> None:  # noqa: F811
    client = engine.client()
    client.attach("ok")
    for bad in BAD_TIMEOUTS:
        refused("timeout", client.attach, "s", timeout=bad)
        refused("timeout", client.act, "ok", {"prompt": "p"}, timeout=bad)
        refused("timeout", client.reset, "ok", timeout=bad)
        refused("timeout", client.detach, "ok", timeout=bad)
        refused("timeout", client.poll, timeout=bad)
        refused("timeout", client.poll_batch, timeout=bad)
    refused("timeout nan: must be 0 to", client.poll, timeout=math.nan)
    still_serves(client, {"ok"})


def test_conditioning_that_is_no_mapping_is_refused(engine: Engines) -> None:  # noqa: F811
    client = engine.client()
    client.attach("ok")
    for bad in BAD_CONDITIONING:
        refused("attach's conditioning must be a mapping", client.attach, "s", bad)
        refused("act's conditioning must be a mapping", client.act, "ok", bad)
        refused("reset's conditioning must be a mapping", client.reset, "ok", bad)
    refused("not NoneType", client.act, "ok", None)
    still_serves(client, {"ok"})


def test_a_row_a_batch_does_not_have_is_refused_by_its_release(engine: Engines) -> None:  # noqa: F811
    client = engine.client()
    client.attach("a")
    client.attach("b")
    batch = client.poll_batch(timeout=20)
    assert batch is not None
    with batch:
        for bad in (-1, len(batch), 1.5, True, "0"):
            refused("row", batch.release_row, bad)
        assert client.held() == len(batch)  # nothing was given back
    assert client.held() == 0
