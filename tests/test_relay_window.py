"""The relay's window (rte.ray.window): which rows a host gives back to its daemon
as their step is sent, which it holds for its caller's release, and that every
row goes back exactly once whatever the caller releases (twice, out of order,
rows it was never sent). No Ray here: the window is plain bookkeeping over real
batches; tests/test_ray.py runs it between a caller and a host on another node."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rte.client.batch import ChunkBatch
from rte.ray.window import WINDOW, Window


def batch(*sessions: str) -> ChunkBatch:
    n = len(sessions)
    return ChunkBatch(
        list(sessions),
        np.arange(n, dtype=np.int64),
        np.zeros((n, 2), np.float32),
        np.zeros(n, np.int64),
        emitted_ns=0,
        pushed_ns=0,
        taken_ns=0,
        release=lambda b, rows: None,
    )


class Daemon:
    """What the window gave back, by batch and row, in order."""

    def __init__(self) -> None:
        self.back: list[tuple[int, int]] = []
        self.batches: dict[int, int] = {}  # id(batch) -> its ident in the test

    def give_back(self, b: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        assert rows.dtype == np.int64
        self.back += [(self.batches[id(b)], int(r)) for r in rows]


def sent(window: Window, daemon: Daemon, ident: int, *sessions: str) -> None:
    b = batch(*sessions)
    daemon.batches[id(b)] = ident
    window.sent_step(ident, b)


def test_rows_with_room_go_back_as_sent_and_the_rest_wait_for_the_caller() -> None:
    daemon = Daemon()
    window = Window(daemon.give_back, 2)
    for ident in range(4):  # a and b each step; a 2-chunk window each
        sent(window, daemon, ident, "a", "b")
    assert daemon.back == [(0, 0), (0, 1), (1, 0), (1, 1)]  # two steps ahead, the rest held
    assert window.ahead == {"a": 2, "b": 2}
    window.released(3, [1])  # a held row released: it goes back, nothing moves ahead
    assert daemon.back[4:] == [(3, 1)]
    window.released(0, [0])  # a chunk that was ahead: a's oldest held row takes its place
    assert daemon.back[5:] == [(2, 0)]
    assert window.ahead == {"a": 2, "b": 2}
    window.released(2, [0, 1])  # (2, 0) was promoted: ahead; (2, 1) was held: given back
    assert daemon.back[6:] == [(2, 1), (3, 0)]  # b's held row, then a's last one promoted
    for ident, rows in ((0, [1]), (1, [0, 1]), (3, [0])):
        window.released(ident, rows)
    assert window.sent == {} and window.ahead == {}
    assert sorted(daemon.back) == [(i, r) for i in range(4) for r in (0, 1)]  # each once


def test_releases_twice_out_of_order_or_never_sent_give_nothing_back_again() -> None:
    daemon = Daemon()
    window = Window(daemon.give_back, 1)
    for ident in range(3):
        sent(window, daemon, ident, "a")
    assert daemon.back == [(0, 0)]
    window.released(2, [0])  # the newest first: held, back directly
    window.released(2, [0])  # again: nothing
    window.released(7, [0])  # a step never sent: nothing
    window.released(1, [5, -1])  # rows it does not have: nothing
    assert daemon.back == [(0, 0), (2, 0)]
    window.released(0, [0, 0])  # the ahead one, named twice in one release
    assert daemon.back == [(0, 0), (2, 0), (1, 0)]  # promoted once
    window.released(1, np.array([0]))
    assert window.sent == {} and window.ahead == {}


def test_a_window_of_nothing_holds_every_row_for_its_caller() -> None:
    assert WINDOW == 0  # (the default: a caller asks for read-ahead)
    daemon = Daemon()
    window = Window(daemon.give_back, 0)
    sent(window, daemon, 0, "a", "b")
    assert daemon.back == [] and window.ahead == {}
    window.released(0, [1, 0])
    assert sorted(daemon.back) == [(0, 0), (0, 1)] and window.sent == {}


def test_a_caller_that_never_releases_holds_at_most_the_window_ahead() -> None:
    daemon = Daemon()
    window = Window(daemon.give_back, 5)
    for ident in range(50):
        sent(window, daemon, ident, "a")
    assert len(daemon.back) == 5  # the daemon's credits stall the rest
    window.clear()
    assert window.sent == {} and window.ahead == {}


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_a_window_that_is_no_count_of_chunks_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="window"):
        Window(Daemon().give_back, bad)


def test_a_ray_client_refuses_a_bad_window_before_it_asks_anyone() -> None:
    from rte.ray import RayClient  # noqa: PLC0415 (sets Ray's environment first)

    with pytest.raises(ValueError, match="window"):
        RayClient(None, [], window=-2)  # (no router, no host: nothing was asked)
