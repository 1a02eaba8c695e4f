"""The host's share of a step (issue 26 defect 9), proven on the simulated device.

A step period is at least DEFERRED's time plus the host's time between steps
(t_host: from a step's publish wait returning to the next step's HOT launch).
The engine times it (``host_share``). Fenced publishing takes it off the
critical path: a step returns before its DEFERRED completes, and the next step
waits for it only after launching its own HOT. The simulated device's race
detector checks every hand-out of frames against the DEFERRED work that writes
them, so a frame published before it is written fails here, every time.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from rte import Action, ComposedEngine
from rte.lanes import CudaLanes, Lane
from rte.lanes.sim import HazardError, SimCuda
from rte.models import ReferenceModel
from rte.stages import Batch

SESSIONS = ["a", "b", "c"]


def sim_engine(publish: str, *, pipelined: bool = True) -> tuple[ComposedEngine, SimCuda]:
    device = SimCuda()
    model = ReferenceModel(4, pipelined=pipelined)
    engine = ComposedEngine(model, lanes=CudaLanes(device), publish=publish)
    for s in SESSIONS:
        engine.attach(s, {"prompt": f"prompt of {s}"})
    return engine, device


def run(engine: ComposedEngine, steps: int) -> list[list[tuple[str, int, bytes]]]:
    """Each step's chunks, read once they may be (fenced: after the next call)."""
    calls: list[list[Any]] = []
    for i in range(steps):
        actions = {s: Action({"move": (i % 3 - 1, 1)}) for s in SESSIONS if i % 2}
        calls.append([r for r in engine.step(SESSIONS, actions) if r.has_chunk])
        if len(calls) > 1:  # the last call's frames are written now, in either mode
            calls[-2] = [(r.session, r.chunk, r.latent.tobytes()) for r in calls[-2]]
    engine.wait_published()
    calls[-1] = [(r.session, r.chunk, r.latent.tobytes()) for r in calls[-1]]
    return calls


@pytest.mark.parametrize("pipelined", [True, False])
def test_fenced_steps_emit_the_frames_of_waited_steps_call_for_call(pipelined: bool) -> None:
    waited, _ = sim_engine("wait", pipelined=pipelined)
    fenced, _ = sim_engine("fenced", pipelined=pipelined)
    assert run(fenced, 8) == run(waited, 8)  # same chunks, same calls, same bytes
    waited.close()
    fenced.close()


def test_the_hot_launch_of_step_n_plus_1_precedes_the_publish_wait_of_step_n() -> None:
    engine, device = sim_engine("fenced")
    deferred_of: list[int] = []  # the DEFERRED stream's time after each step's decode
    for n in range(6):
        start = len(device.order)
        engine.step(SESSIONS)
        order = device.order[start:]
        launches = [i for i, (what, lane, _) in enumerate(order) if what == "launch"]
        hot = [i for i in launches if order[i][1] == "hot"]
        deferred = [order[i][2] for i in launches if order[i][1] == "deferred"]
        waits = [(i, t) for i, (what, lane, t) in enumerate(order) if what == "host_wait"]
        if n >= 2:  # step n decodes chunk n-1; it waits for step n-1's decode, after HOT
            ((at, reached),) = waits
            assert hot and hot[0] < at
            assert reached == deferred_of[-1] < min(deferred)  # step n-1's, not its own
        deferred_of.append(max(deferred, default=deferred_of[-1] if deferred_of else 0))
    engine.close()


def test_a_waited_step_publishes_after_its_hot_launch_and_its_own_decode() -> None:
    engine, device = sim_engine("wait")
    engine.step(SESSIONS)
    start = len(device.order)
    engine.step(SESSIONS)
    order = device.order[start:]
    ((at, (_, lane, reached)),) = [(i, o) for i, o in enumerate(order) if o[0] == "host_wait"]
    assert lane == "deferred"
    assert [o[1] for o in order[:at]].count("hot") >= 1
    assert reached == max(o[2] for o in order[:at] if o[1] == "deferred")  # its own decode
    engine.close()


def test_frames_handed_out_before_their_decode_was_waited_for_are_a_hazard() -> None:
    """The race detector behind every hand-out: what fenced publishing must never do."""
    lanes = CudaLanes(SimCuda())
    batch = Batch([0], ["a"], [0], [{}], out=[np.zeros(4, np.uint8)])
    lanes.run(Lane.DEFERRED, lambda b: b.out[0].fill(7), batch)
    with pytest.raises(HazardError, match="handed out before the deferred work"):
        lanes.handed_out([batch])
    lanes.run(Lane.DEFERRED, lambda b: b.out[0].fill(8), batch)
    lanes.host_wait(lanes.mark(Lane.DEFERRED))
    lanes.handed_out([batch])  # waited for: sound
    lanes.close()


def test_a_fenced_step_then_finalize_or_a_failure_leaves_nothing_unpublished() -> None:
    engine, device = sim_engine("fenced")
    for _ in range(3):
        engine.step(SESSIONS)
    final = engine.finalize()  # waits for everything, the fenced step's frames too
    assert {r.session for r in final} == set(SESSIONS)
    engine.wait_published()  # nothing left behind the fence: no wait
    waits = device.host_waits
    engine.wait_published()
    assert device.host_waits == waits
    engine.close()


def test_publish_must_be_wait_or_fenced() -> None:
    with pytest.raises(ValueError, match="'wait' or 'fenced'"):
        ComposedEngine(ReferenceModel(2), publish="later")


@pytest.mark.parametrize("lanes", ["cpu", "sim"])
def test_the_engine_keeps_the_hosts_share_from_each_publish_to_the_next_hot_launch(
    lanes: str,
) -> None:
    engine = ComposedEngine(ReferenceModel(4), lanes=lanes)
    engine.attach("a", {"prompt": "p"})
    assert engine.host_share().steps == 0
    engine.step(["a"])  # arms and launches HOT: nothing published before it
    for _ in range(4):
        engine.step(["a"])
        time.sleep(0.01)  # the host between steps: at least this, each time
    share = engine.host_share()
    assert share.steps == 3  # each publish followed by a HOT launch (the last by none yet)
    assert share.total_ns >= 3 * 10_000_000 and share.worst_ns >= 10_000_000
    assert share.mean_ms >= 10.0
    engine.close()
