"""default_serve and ServeLoop at the message level: queues in, queues out.

What a caller sees through a client (attach, act, reset, admission...) is tested
once for both client forms in test_client.py; here is what only the Level-2
loop shows: the messages themselves, Stop, Wake, the ``due`` hook, the ``seq``
each answer carries, and that a loop returns outcomes instead of raising.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from rte import (
    Act,
    Action,
    Attach,
    ComposedEngine,
    Detach,
    Notice,
    NoticeKind,
    Reset,
    ServeLoop,
    StepResult,
    Stop,
    Wake,
    default_serve,
)
from rte.errors import UnknownSessionError
from rte.models import ReferenceModel

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams


class Served:
    """A default_serve loop on its own thread, with its two queues."""

    def __init__(self, due: Callable[[list[str]], list[str]] | None = None) -> None:
        self.inbox: queue.Queue[object] = queue.Queue()
        self.outbox: queue.Queue[object] = queue.Queue()
        self.engine = ComposedEngine(ReferenceModel(3))
        self.thread = threading.Thread(
            target=default_serve,
            args=(self.engine, self.inbox, self.outbox),
            kwargs={"due": due},
            daemon=True,
        )
        self.thread.start()

    def until(self, done: Callable[[list[object]], bool], timeout: float = 10.0) -> list[object]:
        """Collect outbox items until ``done(items)``; fails after ``timeout`` seconds."""
        items: list[object] = []
        deadline = time.monotonic() + timeout
        while not done(items):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out; got {items[-5:]}")
            try:
                items.append(self.outbox.get(timeout=min(left, 0.5)))
            except queue.Empty:
                continue
        return items

    def stop(self) -> None:
        self.inbox.put(Stop())
        self.thread.join(10)
        assert not self.thread.is_alive(), "serve loop did not stop"
        self.engine.close()


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.stop()


def chunks(items: list[object], session: str) -> list[StepResult]:
    return [i for i in items if isinstance(i, StepResult) and i.session == session]


def notices(items: list[object], kind: NoticeKind) -> list[Notice]:
    return [i for i in items if isinstance(i, Notice) and i.kind is kind]


def test_answers_carry_the_seq_of_their_request(served: Served) -> None:
    served.inbox.put(Attach("a", {}, seq=7))
    served.inbox.put(Attach("a", {"prompt": 3}, seq=8))  # already attached: a no-op, answered
    served.inbox.put(Detach("ghost", seq=9))
    served.inbox.put(Reset("a", seq=10))
    items = served.until(lambda i: len(notices(i, NoticeKind.ATTACHED)) >= 3)
    answers = [(n.kind, n.seq) for n in items if isinstance(n, Notice)]
    assert answers[:3] == [
        (NoticeKind.ATTACHED, 7),
        (NoticeKind.ATTACHED, 8),
        (NoticeKind.ERROR, 9),
    ]
    assert (NoticeKind.DETACHED, 10) in answers and answers[-1] == (NoticeKind.ATTACHED, 10)


def test_an_unknown_message_is_an_error_and_the_loop_keeps_serving(served: Served) -> None:
    served.inbox.put("not a message")
    served.inbox.put(Attach("a"))
    items = served.until(lambda i: len(chunks(i, "a")) >= 2)
    (error,) = notices(items, NoticeKind.ERROR)
    assert "unknown inbox message str" in error.message and error.seq == 0


def test_stop_finalizes_in_flight_chunks(served: Served) -> None:
    served.inbox.put(Attach("a"))
    served.until(lambda i: len(chunks(i, "a")) >= 2)
    served.inbox.put(Stop())
    items = served.until(lambda i: bool(notices(i, NoticeKind.DETACHED)))
    # the chunk that was in flight at Stop came out before the detach notice
    assert isinstance(items[-2], StepResult) and items[-2].session == "a"


def test_detach_without_finalize_drops_the_in_flight_chunk(served: Served) -> None:
    served.inbox.put(Attach("a"))
    served.until(lambda i: len(chunks(i, "a")) >= 2)
    served.inbox.put(Detach("a", finalize=False, seq=3))
    items = served.until(lambda i: bool(notices(i, NoticeKind.DETACHED)))
    assert items[-1] == Notice("a", NoticeKind.DETACHED, "", 3)
    assert all(isinstance(i, StepResult) for i in items[:-1])  # only what was already out


def test_due_holds_sessions_back_and_wake_resumes_them() -> None:
    allowed = threading.Event()
    served = Served(due=lambda sessions: sessions if allowed.is_set() else [])
    try:
        served.inbox.put(Attach("a"))
        served.until(lambda i: bool(notices(i, NoticeKind.ATTACHED)))
        time.sleep(0.2)
        assert served.outbox.empty()  # attached, but never due: nothing stepped
        allowed.set()
        served.inbox.put(Wake())
        served.until(lambda i: len(chunks(i, "a")) >= 2)
    finally:
        served.stop()


def test_serve_loop_returns_outcomes_and_never_raises_for_a_sender() -> None:
    engine = ComposedEngine(ReferenceModel(1))
    loop = ServeLoop(engine)
    (attached,) = loop.handle(Attach("a", seq=1))
    assert attached == Notice("a", NoticeKind.ATTACHED, "", 1)
    (rejected,) = loop.handle(Attach("b", seq=2))
    assert rejected.kind is NoticeKind.REJECTED and rejected.seq == 2
    (empty,) = loop.handle(Attach("", seq=3))
    assert empty.kind is NoticeKind.ERROR and "reserved" in empty.message
    (bad,) = loop.handle(Act("a", Action({"move": "sideways"}), seq=4))
    assert bad.kind is NoticeKind.ERROR and "move must be two ints" in bad.message
    assert loop.step() == []  # the first step of a pipelined engine emits nothing
    (chunk,) = loop.step()
    assert isinstance(chunk, StepResult) and chunk.chunk == 0
    engine.close()


def test_a_refused_reset_changes_nothing() -> None:
    engine = ComposedEngine(ReferenceModel(1))
    loop = ServeLoop(engine)
    loop.handle(Attach("a", {"prompt": "p"}))
    loop.step()
    loop.step()
    (refused,) = loop.handle(Reset("a", {"prompt": 3}, seq=5))
    assert refused.kind is NoticeKind.ERROR and refused.seq == 5
    assert loop.sessions == ["a"] and loop.conditioning["a"] == {"prompt": "p"}
    (chunk,) = loop.step()  # and it goes on where it was
    assert isinstance(chunk, StepResult) and chunk.chunk == 1
    engine.close()


def test_host_state_is_what_the_loop_keeps_beside_the_engine() -> None:
    engine = ComposedEngine(ReferenceModel(1))
    loop = ServeLoop(engine)
    loop.handle(Attach("a", priority=2))
    loop.handle(Act("a", Action({"move": (1, 0)}), seq=4))
    loop.handle(Act("a", Action({"move": (0, 1)}), seq=5))  # merged: the later one wins
    held = {"priority": 2, "actions": {"move": (0, 1)}, "act_seq": 5, "applied": 0, "marks": []}
    assert loop.host_state("a") == held
    loop.step()  # its step takes them (its receipt: from chunk 0, generated in flight)
    held = {"priority": 2, "actions": {}, "act_seq": 0, "applied": 0, "marks": [[0, 5]]}
    assert loop.host_state("a") == held
    with pytest.raises(UnknownSessionError):
        loop.host_state("b")
    engine.close()
