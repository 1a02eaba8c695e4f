"""Real time through real hosts: capacity measured and published, admission by it,
priority reduction and restoration under overload, receipts on every chunk.

A model whose step costs a known time per row (tests/rowcost_model.py) makes
the capacity at a pace predictable; assertions are on behaviour and broad
bands, never on timing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess, running, wait_for
from rowcost_model import RowCostModel

from rte.client import EngineClient, InProcessClient, ShmClient
from rte.composed import ComposedEngine
from rte.contract import Notice, NoticeKind
from rte.errors import AdmissionError
from rte.ipc.inspect import snapshot
from rte.models.null import NullModel, tag_of

PACE = 20  # Hz: a 50 ms period, 45 ms with the margin
ROW_MS = 4.0  # so about 11 sessions fit
REFUSED = re.compile(r"real-time capacity (\d+) sessions at 20 Hz reached \((\d+) attached\)")


def _consume(client: EngineClient, seconds: float) -> dict[str, int]:
    """Release every chunk for ``seconds``; the chunks each session got."""
    got: dict[str, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        batch = client.poll_batch(timeout=0.05)
        if batch is not None:
            with batch:
                for s in batch.sessions:
                    got[s] = got.get(s, 0) + 1
    return got


def _attach_until_refused(client: EngineClient, limit: int) -> tuple[int, str | None]:
    for i in range(limit):
        try:
            client.attach(f"s{i}")
        except AdmissionError as exc:
            return i, str(exc)
        _consume(client, 0.5)  # turns of every size: the model sees the slope
    return limit, None


class RowCostDaemons:
    """Paced daemons of the row-cost model a test starts (their step's cost per row
    times what ``cost`` holds), stopped after it: each must exit 0."""

    def __init__(self, prefix: str, tmp_path: Path) -> None:
        self.prefix = prefix
        self.cost = tmp_path / "cost"
        self.cost.write_text("1")
        self.made: list[DaemonProcess] = []

    def start(self, *args: str, row_ms: float = ROW_MS) -> DaemonProcess:
        env = {"RTE_TEST_ROW_MS": str(row_ms), "RTE_TEST_COST_FILE": str(self.cost)}
        daemon = DaemonProcess(
            f"{self.prefix}rt{len(self.made)}",
            "--model",
            "rowcost_model:rowcost",
            "--max-sessions",
            "24",
            "--pace-hz",
            str(PACE),
            *args,
            env=env,
        )
        self.made.append(daemon)
        return daemon

    def client(self, *args: str) -> ShmClient:
        """A client of a daemon started with ``args``."""
        return self.start(*args).client()


@pytest.fixture
def rowcost(shm_prefix: str, tmp_path: Path) -> Iterator[RowCostDaemons]:
    daemons = RowCostDaemons(shm_prefix, tmp_path)
    yield daemons
    for daemon in daemons.made:
        assert daemon.stop() == 0, daemon.stderr


def _inspect(name: str, *flags: str) -> str:
    """What ``rte inspect NAME FLAGS`` prints (it must exit 0)."""
    return subprocess.run(
        [sys.executable, "-m", "rte", "inspect", name, *flags],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout


def test_a_paced_daemon_refuses_past_its_real_time_capacity_and_publishes_it(
    rowcost: RowCostDaemons,
) -> None:
    daemon = rowcost.start()
    with daemon.client() as client:
        admitted, refusal = _attach_until_refused(client, 24)
        assert refusal is not None, f"all {admitted} admitted: no real-time refusal"
        match = REFUSED.search(refusal)
        assert match, refusal
        capacity = int(match.group(1))
        assert 5 <= capacity <= 16, refusal  # about 45 ms / 4 ms per session
        assert int(match.group(2)) == admitted
        wait_for(lambda: snapshot(daemon.name)["realtime"]["attached"] == admitted)
        rt = json.loads(_inspect(daemon.name, "--json"))["realtime"]
        assert rt["pace_hz"] == PACE and rt["admission"] == "realtime"
        assert 5 <= rt["capacity"] <= 16 and rt["reduced"] == 0
        text = _inspect(daemon.name)
        assert re.search(rf"capacity ≈ \d+ sessions at 20 Hz, {admitted} attached", text), text
        prom = _inspect(daemon.name, "--prometheus")
        assert re.search(r"^rte_capacity_sessions\{[^}]*\} \d+$", prom, re.M), prom
        assert re.search(r"^rte_pace_hz\{[^}]*\} 20$", prom, re.M), prom


def test_admission_by_rows_admits_past_the_real_time_capacity(rowcost: RowCostDaemons) -> None:
    with rowcost.client("--admission", "rows") as client:
        admitted, refusal = _attach_until_refused(client, 18)
        assert refusal is None and admitted == 18


def _notices_until(
    client: EngineClient,
    kind: NoticeKind,
    sessions: set[str],
    notices: list[Notice],
    seconds: float,
) -> None:
    """Take chunks, and ``client``'s notices into ``notices``, until each of
    ``sessions`` has had a notice of ``kind``; fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not {n.session for n in notices if n.kind is kind} >= sessions:
        assert time.monotonic() < deadline, f"no {kind.name} notices: {notices}"
        _consume(client, 0.2)
        notices += client.notices()


def _reduction_body(client: EngineClient, cost: Path) -> None:
    for s in ("hi0", "hi1"):
        client.attach(s, priority=0)
    for s in ("lo0", "lo1", "lo2", "lo3"):
        client.attach(s, priority=3)
    _consume(client, 1.0)
    cost.write_text("3")  # 6 rows x 12 ms: past the 50 ms period
    notices: list[Notice] = []
    _notices_until(client, NoticeKind.REDUCED, {"lo0", "lo3"}, notices, 20)
    assert not any(n.session.startswith("hi") for n in notices), notices
    assert "tick" in next(n for n in notices if n.kind is NoticeKind.REDUCED).message
    got = _consume(client, 3.0)
    assert all(got.get(s, 0) > 0 for s in ("lo0", "lo1", "lo2", "lo3")), got  # none starves
    assert min(got["hi0"], got["hi1"]) > max(got[f"lo{i}"] for i in range(4)), got
    cost.write_text("1")
    _notices_until(client, NoticeKind.RESTORED, {"lo0", "lo3"}, notices, 40)


def test_overload_reduces_the_low_class_and_restores_it_in_process(tmp_path: Path) -> None:
    cost = tmp_path / "cost"
    cost.write_text("1")
    model = RowCostModel(8, row_ms=ROW_MS, cost_file=str(cost))
    with InProcessClient(ComposedEngine(model), pace_hz=PACE) as client:
        _reduction_body(client, cost)


def test_overload_reduces_the_low_class_and_restores_it_in_a_daemon(
    rowcost: RowCostDaemons,
) -> None:
    with rowcost.client() as client:
        _reduction_body(client, rowcost.cost)


def _receipts_body(client: EngineClient) -> None:
    client.attach("a", {"tag": 0})
    tag_of_seq = {0: 0}
    seqs = []
    checked = 0
    last_applied = 0
    deadline = time.monotonic() + 20
    for k in range(1, 60):
        if k % 3:  # not every step acts
            seq = client.act("a", {"tag": k})
            tag_of_seq[seq] = k
            seqs.append(seq)
        chunk = client.poll(timeout=1.0)
        assert time.monotonic() < deadline
        if chunk is None:
            continue
        with chunk:
            assert chunk.applied in tag_of_seq, (chunk.applied, seqs)
            assert tag_of(chunk.latent) == tag_of_seq[chunk.applied], chunk.applied
            assert chunk.applied >= last_applied
            last_applied = chunk.applied
            checked += 1
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert checked > 20 and last_applied > 0


@pytest.mark.parametrize("pipelined", [True, False], ids=["depth2", "depth1"])
def test_receipts_name_the_last_action_each_chunk_applied_in_process(pipelined: bool) -> None:
    with InProcessClient(ComposedEngine(NullModel(4, pipelined=pipelined))) as client:
        _receipts_body(client)


def test_receipts_name_the_last_action_each_chunk_applied_in_a_daemon(shm_prefix: str) -> None:
    with (
        running(f"{shm_prefix}rc", "--model", "null", "--max-sessions", "4") as daemon,
        daemon.client() as client,
    ):
        _receipts_body(client)


def test_a_pool_takes_a_real_time_refusal_to_its_next_daemon(rowcost: RowCostDaemons) -> None:
    """Two daemons of the same rows, one of them four times as costly per session:
    when the costly one refuses by real time, the pool's attach goes to the other."""
    from rte.client import connect_pool  # noqa: PLC0415

    cheap = rowcost.start()
    costly = rowcost.start(row_ms=4 * ROW_MS)
    cheap.client().close()  # both up
    costly.client().close()
    with connect_pool([cheap.name, costly.name], timeout=30) as pool:
        for i in range(10):  # past the costly one's capacity (about 2), under the cheap one's
            pool.attach(f"s{i}")
            _consume(pool, 0.3)  # turns of every size: each daemon learns its slope
        on_costly = snapshot(costly.name)["realtime"]["attached"]
        on_cheap = snapshot(cheap.name)["realtime"]["attached"]
        assert on_costly + on_cheap == 10
        assert on_costly < on_cheap  # the refusals went next door, none was lost


def test_attach_with_wait_gets_the_place_a_leaving_session_frees(
    rowcost: RowCostDaemons,
) -> None:
    import threading  # noqa: PLC0415

    # 4.2 ms a row puts the knee between two counts (45 / 4.2 = 10.7 rows), not on
    # one (45 / 4 = 11.25: 11 rows fit by 1 ms, and a loaded box's naps wake late
    # enough to make it 10 while the test waits); and two sessions leave, so that
    # an estimate that still drifts by one leaves the waiter its place
    daemon = rowcost.start(row_ms=4.2)
    with daemon.client() as other, daemon.client() as client:
        other.attach("x")  # their places, freed later from this other client
        other.attach("y")
        _, refusal = _attach_until_refused(client, 24)
        assert refusal is not None
        with pytest.raises(AdmissionError, match="real-time capacity"):
            client.attach("late")  # no wait: refused at once

        def leave() -> None:  # (on their own client)
            other.detach("x")
            other.detach("y")

        leaving = threading.Timer(0.5, leave)
        leaving.start()
        try:
            client.attach("late", wait=10.0)  # waits for the room x and y leave
        finally:
            leaving.join(15)
        assert "late" in client.sessions and not other.sessions
