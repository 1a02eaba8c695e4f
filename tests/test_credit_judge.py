"""Which of a client's sessions may step: the C judge against its NumPy reference.

``Connection.with_credit`` is one C call (``shm_with_credit``) over the
connection's own arrays and the client's consumed counts in a real credit block
in shared memory; ``with_credit_numpy`` is the reference it replaced. Both must
name the same sessions whatever the client wrote there (stale, ahead, hostile).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from rte.ipc.clients import Connection
from rte.protocol.mailbox import ClientBlock
from shm import Segment
from shm.counting import CreditJudge, FigureCounter
from shm.names import shm_name
from shm.segment import HEADER_SIZE

HANDLES = 96


@pytest.fixture
def block(shm_prefix: str) -> Iterator[ClientBlock]:
    segment = Segment.create(
        shm_name(shm_prefix, "credit"), HEADER_SIZE + ClientBlock.size(HANDLES)
    )
    try:
        yield ClientBlock(segment, HEADER_SIZE, HANDLES)
    finally:
        segment.close()
        segment.unlink()


def _connection(block: ClientBlock) -> Connection:
    # with_credit reads the credit block and the connection's own arrays, no ring
    return Connection(0, os.getpid(), 0.0, None, None, 0, block, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(4))
def test_the_c_judge_names_the_sessions_the_reference_names(block: ClientBlock, seed: int) -> None:
    rng = np.random.default_rng(seed)
    c = _connection(block)
    bound: list[str] = []
    partial = 0
    for turn in range(300):
        if rng.random() < 0.2 or not bound:  # attach
            if len(bound) < HANDLES:
                name = f"s{turn}"
                c.bind(name, int(rng.integers(1, 5)))
                bound.append(name)
        elif rng.random() < 0.1:  # detach
            c.unbind(bound.pop(int(rng.integers(0, len(bound)))))
        for name in bound:  # steps emitted, releases consumed (some hostile)
            h = c.handles[name]
            c.emitted[h] += int(rng.integers(0, 2))
            roll = rng.random()
            if roll < 0.5:
                block.tally[h] = max(0, int(c.emitted[h]) - int(rng.integers(0, 6)))
            elif roll < 0.52:
                block.tally[h] = int(rng.integers(0, 1 << 63))  # a client that lies
        due = c.with_credit()
        assert due == c.with_credit_numpy()
        partial += 0 < len(due) < len(bound)
    assert partial > 50  # (it judged mixed cases, not only all or none)


def test_no_session_and_every_session_due(block: ClientBlock) -> None:
    c = _connection(block)
    assert c.with_credit() == [] == c.with_credit_numpy()
    for k in range(70):
        c.bind(f"s{k}", 2)
    assert c.with_credit() == [f"s{k}" for k in range(70)]
    c.emitted[:] += 2  # two out each, none consumed: none may step
    assert c.with_credit() == [] == c.with_credit_numpy()
    block.tally[c.handles["s5"]] = 1
    assert c.with_credit() == ["s5"] == c.with_credit_numpy()


def test_a_judge_or_a_counter_over_arrays_of_different_lengths_is_refused() -> None:
    one = np.zeros(4, np.int64)
    with pytest.raises(ValueError, match="per handle"):
        CreditJudge(one, np.zeros(4, np.uint64), one, np.zeros(3, bool), np.zeros(4, bool))
    words = np.zeros((4, 12), np.int64)
    with pytest.raises(ValueError, match="one row per handle"):
        FigureCounter(words, np.zeros((4, 8), np.int64), np.zeros((3, 8), np.int64), 1)
