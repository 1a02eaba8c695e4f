"""What a caller can rely on, written once and run on every client form.

Every test here takes ``engine`` (parametrized over six forms: an
InProcessClient over an engine on a thread of this process, a ShmClient of a
real ``rte serve`` daemon in another process, and a PoolClient found by name
over real daemons ``NAME-*``; then each as an AsyncClient on an asyncio loop,
through tests/async_facade.py) and uses only the public EngineClient interface.
What only the daemon shows (zero copy, ownership across processes, crashes) is
in test_daemon.py; what only a pool of several shows (spreading, a member's
death), in test_pool.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from async_facade import LoopClient
from daemon_harness import DaemonProcess, Deadline, take

from rte import AdmissionError, ClientClosedError, ComposedEngine, Notice, NoticeKind, RequestError
from rte.client import Chunk, EngineClient, InProcessClient, PoolClient, connect, connect_async
from rte.models import load_model
from rte.models.null import tag_of

pytestmark = pytest.mark.usefixtures("each_lanes")  # CPU lanes, then simulated CUDA streams


ROWS = 3


class Engines:
    """Clients of one engine per model, in the form the test is parametrized with."""

    def __init__(self, form: str, prefix: str) -> None:
        self.form = form
        self.prefix = prefix
        self.daemons: dict[str, DaemonProcess] = {}
        self.clients: list[EngineClient] = []

    def client(self, model: str = "reference") -> EngineClient:
        if self.form == "async-inprocess":
            client: Any = LoopClient(connect_async(model=model, max_sessions=ROWS))
        elif self.form == "inprocess":
            client = InProcessClient(ComposedEngine(load_model(model, max_sessions=ROWS)))
        else:
            pool = self.form.endswith("pool")  # one member, NAME-0, found by the name NAME
            name = f"{self.prefix}{model}"
            daemon = self.daemons.get(model)
            if daemon is None:
                daemon = self.daemons[model] = DaemonProcess(
                    f"{name}-0" if pool else name,
                    *("--model", model, "--max-sessions", str(ROWS), "--max-clients", "4"),
                )
                if pool:
                    daemon.client().close()  # up, so that NAME-* is found
            if self.form == "async-shm":
                client = LoopClient(connect_async(daemon.name, timeout=30))
            elif self.form == "async-pool":
                client = LoopClient(connect_async(name, timeout=30))
                assert client.name == daemon.name  # the pool of NAME-0
            elif pool:
                client = connect(name, timeout=30)
                assert isinstance(client, PoolClient)
            else:
                client = daemon.client()
        self.clients.append(client)
        return client  # type: ignore[no-any-return]

    def close(self) -> None:
        for client in self.clients:
            client.shut() if isinstance(client, LoopClient) else client.close()
        for daemon in self.daemons.values():
            assert daemon.stop() == 0, daemon.stderr


FORMS = ["inprocess", "shm", "pool", "async-inprocess", "async-shm", "async-pool"]


@pytest.fixture(params=FORMS)
def engine(request: pytest.FixtureRequest, shm_prefix: str, each_lanes: str) -> Iterator[Engines]:
    if request.param.startswith("async") and each_lanes != "cpu":
        pytest.skip("the lanes are the engine's: the asyncio form runs on CPU lanes only")
    engines = Engines(request.param, shm_prefix)
    yield engines
    engines.close()


def indices(chunks: list[Chunk]) -> list[int]:
    return [c.chunk for c in chunks]


def test_chunks_arrive_in_order_shaped_and_read_only(engine: Engines) -> None:
    client = engine.client()
    client.attach("a", {"prompt": "forest"})
    client.attach("b")
    assert client.sessions == {"a", "b"}
    seen: dict[str, list[int]] = {"a": [], "b": []}
    limit = Deadline(what="six chunks of each session")
    while min(len(v) for v in seen.values()) < 6:
        limit.check(seen)
        chunk = client.poll(timeout=10)
        assert chunk is not None
        assert client.held() == 1
        with chunk:
            assert chunk.latent.shape == client.manifest.latent_shape
            assert chunk.latent.dtype == np.dtype(client.manifest.latent_dtype)
            assert not chunk.latent.flags.writeable
            assert chunk.timing.emitted_ns >= chunk.timing.generated_ns > 0
            seen[chunk.session].append(chunk.chunk)
        assert chunk.released and client.held() == 0
    for got in seen.values():
        assert got == list(range(len(got)))


def test_an_action_shows_in_every_later_chunk(engine: Engines) -> None:
    client = engine.client("null")
    client.attach("s")
    before = take(client, "s", 3)
    client.act("s", {"tag": 5})
    stream = before + take(client, "s", 1)
    limit = Deadline(what="the chunk that shows the action")
    while tag_of(stream[-1].latent) != 5:
        limit.check()
        stream += take(client, "s", 1)
    stream += take(client, "s", 4)
    tags = [tag_of(c.latent) for c in stream]
    first = tags.index(5)
    assert tags[first:] == [5] * (len(tags) - first)  # it stays, chunk after chunk
    assert set(tags[:first]) <= {-1}
    assert indices(stream) == list(range(len(stream)))
    assert client.notices() == []


def test_refused_requests_raise_or_tell_and_change_nothing(engine: Engines) -> None:
    client = engine.client()
    client.attach("a")
    with pytest.raises(RequestError, match="prompt must be a str"):
        client.attach("bad", {"prompt": 3})
    with pytest.raises(RequestError, match="'ghost' is not attached"):
        client.detach("ghost")
    with pytest.raises(RequestError, match="'ghost' is not attached"):
        client.reset("ghost")
    with pytest.raises(RequestError, match="reserved"):
        client.attach("")
    with pytest.raises(RequestError, match="unknown conditioning key 'mvoe'"):
        client.attach("typo", {"mvoe": (0, 1)})
    client.act("ghost", {"move": (0, 1)})
    client.act("a", {"move": "sideways"})
    client.act("a", {"mvoe": (0, 1)})
    errors: list[str] = []
    deadline = time.monotonic() + 10
    while len(errors) < 3:
        assert time.monotonic() < deadline, errors
        errors += [n.message for n in client.notices() if n.kind is NoticeKind.ERROR]
        time.sleep(0.01)
    assert any("'ghost' is not attached" in e for e in errors)
    assert any("move must be two ints" in e for e in errors)
    assert any(
        "unknown conditioning key 'mvoe': reference takes frame, move, prompt" in e for e in errors
    )
    assert client.sessions == {"a"}
    got = indices(take(client, "a", 4))
    assert got == list(range(got[0], got[0] + 4))  # "a" streamed on, untouched


def test_admission_beyond_capacity_then_rows_are_reused(engine: Engines) -> None:
    client = engine.client()
    for i in range(ROWS):
        client.attach(f"s{i}")
    with pytest.raises(AdmissionError, match="rows are in use"):
        client.attach("one-too-many")
    assert "one-too-many" not in client.sessions
    client.detach("s0")
    client.attach("one-too-many")
    assert indices(take(client, "one-too-many", 2)) == [0, 1]


def test_credits_the_quota_cannot_hold_are_refused_at_attach(engine: Engines) -> None:
    """A quota holds every row at the default credits plus one in flight (3 x 3 = 9
    here): an attach whose credits would push past it is refused, saying so, rather
    than leaving the client's sessions to stall for slots, silently."""
    client = engine.client()
    client.attach("a", credits=4)
    client.attach("b", credits=4)
    with pytest.raises(RequestError, match="more than its quota of 9 slots"):
        client.attach("c", credits=4)
    assert "c" not in client.sessions
    client.attach("c", credits=1)  # 4 + 4 + 1 fits
    assert indices(take(client, "c", 2)) == [0, 1]


def test_reset_restarts_identically_and_a_refused_one_changes_nothing(engine: Engines) -> None:
    client = engine.client()
    client.attach("r", {"prompt": "p"})
    first = [c.latent.copy() for c in take(client, "r", 3)]
    client.reset("r")
    assert client.sessions == {"r"}
    stream = take(client, "r", 3)
    limit = Deadline(what="the restarted stream")
    while [c.chunk for c in stream[-3:]] != [0, 1, 2]:  # in-flight chunks of the old run
        limit.check([c.chunk for c in stream])
        stream += take(client, "r", 1)
    for old, new in zip(first, stream[-3:], strict=True):
        np.testing.assert_array_equal(old, new.latent)
    with pytest.raises(RequestError, match="prompt must be a str"):
        client.reset("r", {"prompt": 3})
    assert client.sessions == {"r"}
    assert indices(take(client, "r", 2)) == [3, 4]  # it went on where it was


def test_attaching_a_session_again_keeps_it_streaming(engine: Engines) -> None:
    """An attach of a session the client has already changes nothing: its chunks
    in flight (emitted before the second ATTACHED is read) still give their
    credit back when released, so the stream never stalls."""
    client = engine.client()
    client.attach("a", {"prompt": "p"}, credits=2)
    time.sleep(0.5)  # both credits spent: two chunks wait, unread, behind the answer
    client.attach("a", {"prompt": "q"}, credits=1)
    assert client.sessions == {"a"}
    assert indices(take(client, "a", 6)) == [0, 1, 2, 3, 4, 5]


def test_detach_ends_the_stream_after_its_in_flight_chunk(engine: Engines) -> None:
    client = engine.client()
    client.attach("a")
    client.attach("b")
    seen = indices(take(client, "a", 3))
    client.detach("a")
    assert client.sessions == {"b"}
    late: list[int] = []
    others = 0
    limit = Deadline(what="the stream after the detach")
    while others < 8 * ROWS:  # "b" streams on; what "a" had in flight comes first
        limit.check()
        chunk = client.poll(timeout=10)
        assert chunk is not None
        with chunk:
            if chunk.session != "a":
                others += 1
                continue
            assert others <= 4 * ROWS, f"chunk {chunk.chunk} of 'a' long after its detach"
            late.append(chunk.chunk)
    assert seen + late == list(range(len(seen) + len(late)))  # no gap


def test_a_consumer_that_stops_reading_stalls_without_growing(engine: Engines) -> None:
    client = engine.client()
    client.attach("a")
    client.attach("b")
    time.sleep(0.5)  # the engine could make thousands of chunks meanwhile
    held = []
    while (chunk := client.poll(timeout=0.3)) is not None:
        held.append(chunk)
        assert len(held) <= 4 * ROWS, "chunks kept coming while none was released"
    assert client.held() == len(held) > 0
    for chunk in held:
        chunk.release()
    assert client.held() == 0
    stream = {s: [c.chunk for c in held if c.session == s] for s in "ab"}
    more = {"a": 0, "b": 0}
    limit = Deadline(what="both streams after the release")
    while min(more.values()) < 2:  # released: both stream again, from where they were
        limit.check(more)
        chunk = client.poll(timeout=10)
        assert chunk is not None
        with chunk:
            stream[chunk.session].append(chunk.chunk)
            more[chunk.session] += 1
    for got in stream.values():
        assert got == list(range(len(got)))


def test_calls_after_close_raise_client_closed(engine: Engines) -> None:
    client = engine.client()
    client.attach("a")
    chunk = take(client, "a", 1)[0]
    kept = client.poll(timeout=10)
    assert kept is not None
    client.close()
    client.close()  # idempotent
    assert client.closed
    for call in (
        lambda: client.attach("b"),
        lambda: client.act("a", {"move": (0, 1)}),
        lambda: client.reset("a"),
        lambda: client.detach("a"),
        lambda: client.poll(timeout=0.1),
        client.notices,
        lambda: next(client.results(timeout=0.1)),
    ):
        with pytest.raises(ClientClosedError, match="closed"):
            call()
    kept.release()  # a chunk held across close: released without harm
    chunk.release()
    assert client.held() == 0


def test_a_client_is_a_context_manager(engine: Engines) -> None:
    with engine.client() as client:
        client.attach("a")
        assert take(client, "a", 1)
    assert client.closed


def test_both_forms_refuse_what_the_wire_cannot_carry(engine: Engines) -> None:
    client = engine.client()
    with pytest.raises(RequestError, match="longer than 256"):
        client.attach("s" * 300)
    client.attach("a")
    with pytest.raises(RequestError, match="cannot send a set"):
        client.act("a", {"move": {1, 2}})
    with pytest.raises(RequestError, match="keys must be str"):
        client.act("a", {"move": (0, 1), 7: 1})  # type: ignore[dict-item]
    assert take(client, "a", 2)


def test_a_large_input_reaches_the_engine_by_value_or_by_loan(engine: Engines) -> None:
    """A 512x512x3 frame (far too big for a ring record) shows in the chunks
    after the action that sent it: copied into a slot, or written in place
    into a loaned one."""
    client = engine.client()
    client.attach("a")
    h, w, _ = client.manifest.latent_shape
    client.act("a", {"frame": np.full((8 * h, 8 * w, 3), 200, np.uint8)})

    def until(looks_right: Callable[[np.ndarray], bool], what: str) -> None:
        limit = Deadline(what=what)
        told: list[Notice] = []  # (a refused act says why here)
        while True:
            limit.check(f"(notices: {told})")
            told += client.notices()
            (chunk,) = take(client, "a", 1)
            if looks_right(chunk.latent):
                return

    until(lambda frame: bool(frame.min() >= 100), "a chunk with the bright frame blended in")
    for _ in range(3):
        with client.loan((8 * h, 8 * w, 3), "uint8") as frame:
            frame[...] = 0  # written in place: the slot is what the engine reads
            client.act("a", {"frame": frame})
        until(lambda frame: bool(frame.max() <= 127), "a chunk with the dark frame blended in")
        with client.loan((8 * h, 8 * w, 3), "uint8") as unsent:
            unsent[...] = 255  # never sent: its slot goes back on leaving the block
    with pytest.raises(RequestError, match="frame must be a uint8 image"):
        client.attach("b", {"frame": np.zeros((h + 1, w, 3), np.uint8)})
    assert client.sessions == {"a"}
    assert take(client, "a", 2)


def _frames_until(
    client: EngineClient, last: dict[str, int], *watch: str
) -> dict[str, dict[int, Any]]:
    """The frames by chunk index of the sessions of ``last`` (until each has chunk
    ``last[session]``) and of ``watch``."""
    got: dict[str, dict[int, Any]] = {s: {} for s in (*last, *watch)}
    limit = Deadline(what="the sessions' frames")
    while any(last[s] not in got[s] for s in last):
        limit.check({s: sorted(v) for s, v in got.items()})
        chunk = client.poll(timeout=1.0)
        if chunk is None:
            continue
        with chunk:
            if chunk.session in got:
                assert chunk.chunk not in got[chunk.session], "a chunk came twice"
                got[chunk.session][chunk.chunk] = chunk.latent.copy()
    return got


def test_suspend_then_resume_goes_on_bit_identical_to_a_twin(engine: Engines) -> None:
    """A suspended session's row is freed and no chunk of it comes; resumed, it goes
    on at its next chunk index with no gap or repeat, its frames those of a twin
    that was never suspended (the same session id, on an engine of its own)."""
    with InProcessClient(ComposedEngine(load_model("reference", max_sessions=1))) as alone:
        alone.attach("a", {"prompt": "forest"})
        twin = _frames_until(alone, {"a": 10})["a"]
    client = engine.client()
    client.attach("a", {"prompt": "forest"}, credits=1)
    before = _frames_until(client, {"a": 2})["a"]
    client.suspend("a")
    assert client.sessions == {"a"}  # still its client's
    client.suspend("a")  # again: it stays suspended
    for i in range(ROWS - 1):  # its row is free (a daemon's client holds ROWS sessions)
        client.attach(f"other{i}")
    while_parked = _frames_until(client, {"other0": 3}, "a")["a"]
    assert len(set(while_parked) - set(before)) <= 1, "only its in-flight chunk may come"
    client.detach("other0")
    client.resume("a")
    frames = {**before, **while_parked, **_frames_until(client, {"a": 10})["a"]}
    assert sorted(frames) == list(range(11)), "a gap in its chunk indices"
    for index, frame in frames.items():
        np.testing.assert_array_equal(frame, twin[index], err_msg=f"chunk {index}")


def test_suspend_and_resume_refusals_raise_and_change_nothing(engine: Engines) -> None:
    client = engine.client()
    with pytest.raises(RequestError, match="ghost"):
        client.suspend("ghost")
    client.attach("a")
    with pytest.raises(RequestError, match="not suspended"):
        client.resume("a")
    assert indices(take(client, "a", 2)) == [0, 1]
    client.suspend("a")
    if engine.form.endswith("inprocess"):  # (a daemon's client holds at most ROWS sessions)
        for i in range(ROWS):
            client.attach(f"s{i}")
        with pytest.raises(AdmissionError, match="stays suspended"):
            client.resume("a")  # no row free: it stays parked
        client.detach("s0")
    client.resume("a")
    got = indices(take(client, "a", 2))
    assert got == list(range(got[0], got[0] + 2)) and got[0] >= 2


def test_attach_with_wait_asks_again_until_room_or_the_wait_ends(engine: Engines) -> None:
    """At capacity, ``attach(wait=)`` ends in the AdmissionError once the wait has
    passed, and nothing is attached. On the asyncio form the waiting attach yields
    to its loop: another task's detach there makes the room it then takes."""
    client = engine.client()
    for i in range(ROWS):
        client.attach(f"s{i}")
    with pytest.raises(AdmissionError, match="rows are in use"):
        client.attach("late", wait=0.2)
    assert "late" not in client.sessions
    with pytest.raises(RequestError, match="wait"):
        client.attach("late", wait=-1)
    if isinstance(client, LoopClient):
        aio = client.client

        async def detach_later() -> None:
            await asyncio.sleep(0.3)  # the attach below is refused, waiting, meanwhile
            await aio.detach("s0")

        async def both() -> None:
            await asyncio.gather(aio.attach("late", wait=20.0), detach_later())

        client.loop.run_until_complete(asyncio.wait_for(both(), 30))
        assert "late" in client.sessions and "s0" not in client.sessions
        assert indices(take(client, "late", 2)) == [0, 1]


def _state_after(chunks: int) -> tuple[Any, dict[int, Any]]:
    """Session ``a`` of an engine of this process, suspended after ``chunks`` steps:
    its state and the frames it emitted."""
    frames: dict[int, Any] = {}
    with ComposedEngine(load_model("reference", max_sessions=1)) as elsewhere:
        elsewhere.attach("a", {"prompt": "forest"})
        for _ in range(chunks):
            frames.update({r.chunk: np.array(r.latent) for r in elsewhere.step(["a"])})
        return elsewhere.suspend("a"), frames


def test_a_session_moves_in_with_its_state_and_goes_on_as_its_twin(engine: Engines) -> None:
    """``attach(s, state=)`` takes a session suspended elsewhere: its chunk indices go
    on without a gap or a repeat, its frames the twin's; a state of another id, or
    with conditioning beside it, or of another model, is refused, nothing attached."""
    with InProcessClient(ComposedEngine(load_model("reference", max_sessions=1))) as alone:
        alone.attach("a", {"prompt": "forest"})
        twin = _frames_until(alone, {"a": 9})["a"]
    state, before = _state_after(4)
    client = engine.client()
    with pytest.raises(RequestError, match="under its own id"):
        client.attach("b", state=state)
    with pytest.raises(RequestError, match="takes no conditioning"):
        client.attach("a", {"prompt": "x"}, state=state)
    other = engine.client("null")
    with pytest.raises(RequestError, match="StateError"):
        other.attach("a", state=state)  # the null model's engine refuses a reference state
    assert "a" not in other.sessions
    client.attach("a", state=state)
    after = _frames_until(client, {"a": 9})["a"]
    assert min(after) == max(before) + 1, "a gap or a repeat where it moved"
    for index, frame in {**before, **after}.items():
        np.testing.assert_array_equal(frame, twin[index], err_msg=f"chunk {index}")
