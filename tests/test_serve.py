"""default_serve end to end. The ``served`` fixture yields an (inbox, outbox) pair
with a loop behind it; the bodies do not care how the loop is hosted."""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from daemon_harness import DaemonProcess

from rte import (
    Act,
    Action,
    Attach,
    ComposedEngine,
    Detach,
    Notice,
    NoticeKind,
    Reset,
    StepResult,
    Stop,
    default_serve,
)
from rte.client import Client
from rte.contract import ResultKind
from rte.models import ReferenceModel
from rte.wire import NoticeCode, RecordType, decode, encode_value


class Endpoints:
    def __init__(self, inbox: Any, outbox: Any) -> None:
        self.inbox = inbox
        self.outbox = outbox

    def send(self, message: object) -> None:
        self.inbox.put(message)

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


def chunks(items: list[object], session: str) -> list[StepResult]:
    return [i for i in items if isinstance(i, StepResult) and i.session == session]


def notices(items: list[object], kind: NoticeKind) -> list[Notice]:
    return [i for i in items if isinstance(i, Notice) and i.kind is kind]


class DaemonInbox:
    """The inbox of a daemon, seen through a client: messages become wire records."""

    def __init__(self, client: Client, attached: set[str]) -> None:
        self.client = client
        self.attached = attached

    def put(self, message: object) -> None:
        c = self.client
        match message:
            case Attach():
                c._send(
                    RecordType.ATTACH, message.session, encode_value(dict(message.conditioning)), 5
                )
            case Act():
                body = encode_value(dict(message.action.conditioning))
                c._send(RecordType.ACT, message.session, body, 5)
            case Detach():
                c._send(RecordType.DETACH, message.session, b"", 5)
            case Reset():
                body = (
                    b""
                    if message.conditioning is None
                    else encode_value(dict(message.conditioning))
                )
                c._send(RecordType.RESET, message.session, body, 5)
            case Stop():
                for session in sorted(self.attached):
                    c._send(RecordType.DETACH, session, b"", 5)
            case _:
                c._inbox.push(b"\xff" * 8, timeout=5)  # not a record of any known type


NOTICE_KINDS = {
    NoticeCode.ATTACHED: NoticeKind.ATTACHED,
    NoticeCode.DETACHED: NoticeKind.DETACHED,
    NoticeCode.REJECTED: NoticeKind.REJECTED,
    NoticeCode.ERROR: NoticeKind.ERROR,
}


class DaemonOutbox:
    """The outbox of a daemon, seen through a client, in arrival order."""

    def __init__(self, client: Client, attached: set[str]) -> None:
        self.client = client
        self.attached = attached
        self.pending: collections.deque[object] = collections.deque()

    def get(self, timeout: float) -> object:
        if not self.pending:
            for raw in self.client._outbox.pop_batch(timeout):
                record = decode(raw)
                if record.type is RecordType.CHUNK:
                    with self.client._chunk(record) as chunk:
                        self.pending.append(
                            StepResult(
                                chunk.session, chunk.chunk, ResultKind.CHUNK,
                                chunk.latent.copy(), chunk.timing,
                            )
                        )  # fmt: skip
                    continue
                kind = NOTICE_KINDS[NoticeCode(record.code)]
                if kind is NoticeKind.ATTACHED:
                    self.attached.add(record.session)
                elif kind is NoticeKind.DETACHED:
                    self.attached.discard(record.session)
                self.pending.append(Notice(record.session, kind, str(record.value)))
        if not self.pending:
            raise queue.Empty
        return self.pending.popleft()


@pytest.fixture(params=["inprocess", "daemon"])
def served(request: pytest.FixtureRequest, shm_prefix: str) -> Iterator[Endpoints]:
    if request.param == "daemon":
        daemon = DaemonProcess(shm_prefix, "--max-sessions", "3")
        client = daemon.client()
        attached: set[str] = set()
        yield Endpoints(DaemonInbox(client, attached), DaemonOutbox(client, attached))
        client.close()
        assert daemon.stop() == 0, daemon.stderr
        return
    inbox: queue.Queue[object] = queue.Queue()
    outbox: queue.Queue[object] = queue.Queue()
    engine = ComposedEngine(ReferenceModel(3), lanes="cpu")
    thread = threading.Thread(target=default_serve, args=(engine, inbox, outbox), daemon=True)
    thread.start()
    yield Endpoints(inbox, outbox)
    inbox.put(Stop())
    thread.join(10)
    assert not thread.is_alive(), "serve loop did not stop"
    engine.close()


def test_stream_act_detach(served: Endpoints) -> None:
    served.send(Attach("a", {"prompt": "forest"}))
    served.send(Attach("b"))
    items = served.until(lambda i: len(chunks(i, "a")) >= 5 and len(chunks(i, "b")) >= 5)
    assert [n.session for n in notices(items, NoticeKind.ATTACHED)] == ["a", "b"]
    assert [r.chunk for r in chunks(items, "a")][:5] == [0, 1, 2, 3, 4]
    served.send(Act("a", Action({"move": (1, 1), "prompt": "city"})))
    served.send(Detach("b"))
    items = served.until(
        lambda i: bool(notices(i, NoticeKind.DETACHED)) and len(chunks(i, "a")) >= 5
    )
    got_b = [r.chunk for r in chunks(items, "b")]
    assert got_b == sorted(got_b)
    served.send(Stop())


def test_bad_messages_get_errors_and_the_loop_keeps_serving(served: Endpoints) -> None:
    served.send(Attach("a"))
    served.send("not a message")
    served.send(Act("ghost", Action({"move": (0, 1)})))
    served.send(Act("a", Action({"move": "sideways"})))
    served.send(Attach("bad", {"prompt": 7}))
    served.send(Detach("ghost"))
    items = served.until(
        lambda i: len(notices(i, NoticeKind.ERROR)) >= 5 and len(chunks(i, "a")) >= 3
    )
    messages = " | ".join(n.message for n in notices(items, NoticeKind.ERROR))
    assert "unknown inbox message" in messages or "unknown record type" in messages
    assert "'ghost' is not attached" in messages
    assert "move must be two ints" in messages
    assert "prompt must be a str" in messages
    served.send(Attach("b"))
    served.until(lambda i: len(chunks(i, "b")) >= 2)


def test_attach_beyond_capacity_is_rejected_not_dropped(served: Endpoints) -> None:
    for s in "abcd":
        served.send(Attach(s))
    items = served.until(lambda i: len(notices(i, NoticeKind.REJECTED)) >= 1)
    (rejected,) = notices(items, NoticeKind.REJECTED)
    assert rejected.session == "d" and "rows are in use" in rejected.message


def test_reset_restarts_the_session_from_chunk_zero(served: Endpoints) -> None:
    served.send(Attach("a", {"prompt": "p"}))
    first = chunks(served.until(lambda i: len(chunks(i, "a")) >= 3), "a")
    served.send(Reset("a"))
    items = served.until(lambda i: bool(notices(i, NoticeKind.ATTACHED)))
    items += served.until(lambda i: len([r for r in chunks(i, "a") if r.chunk == 2]) >= 1)
    after = [r for r in chunks(items, "a")]
    restart = next(k for k in range(1, len(after)) if after[k].chunk <= after[k - 1].chunk)
    replay = after[restart:]
    assert [r.chunk for r in replay][:3] == [0, 1, 2]
    for old, new in zip(first[:3], replay[:3], strict=True):
        assert np.array_equal(old.latent, new.latent)


def test_stop_finalizes_in_flight_chunks(served: Endpoints) -> None:
    served.send(Attach("a"))
    served.until(lambda i: len(chunks(i, "a")) >= 2)
    served.send(Stop())
    items = served.until(lambda i: bool(notices(i, NoticeKind.DETACHED)))
    # the chunk that was in flight at Stop came out before the detach notice
    assert isinstance(items[-2], StepResult) and items[-2].session == "a"
