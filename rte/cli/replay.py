"""``rte replay TRACE``: make a recorded session again and say where it first differs.

In this process by default (the trace's model, or ``--model``, on ``--device``
or the trace's device, stepped here: :func:`rte.replay.replay_engine`), or
through the running daemon ``--name`` (:func:`rte.replay.replay_client`).
Flat out; the output says how fast beside the trace's own pace. Exit 0 with
``identical, N chunks``; exit 1 naming the first chunk that differs, with both
hashes. A trace that cannot be read is one line naming its line (exit 1).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rte.client import connect
from rte.composed import ComposedEngine
from rte.errors import ConfigurationError
from rte.models import load_model
from rte.replay import Replayed, replay_client, replay_engine
from rte.stages import StageModel
from rte.trace import Trace, read_trace


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="make a recorded session again and report the first chunk that differs",
        description="Replay a trace (rte record, or rte.recorder.Recorder): the session's "
        "attach and each action at the chunk it applied at, flat out; compare every "
        "chunk's hash. Exit 0 when identical, 1 at the first chunk that differs.",
    )
    p.add_argument("trace", help="the trace file (JSON lines)")
    p.add_argument("--model", help="the model to replay on (default: the trace's)")
    p.add_argument("--device", help="where it computes: cpu, cuda, cuda:N (default: the trace's)")
    p.add_argument("--name", help="replay through this running daemon instead of in process")
    p.set_defaults(func=replay)


def replay(args: argparse.Namespace) -> int:
    path = Path(args.trace)
    if not path.is_file():
        raise ConfigurationError(f"{path}: no such trace file")
    trace = read_trace(path)
    acts = sum(1 for a in trace.acts if a.refused is None and a.chunk is not None)
    print(
        f"trace {path}: session {trace.session!r}, {len(trace.chunks)} chunks, {acts} actions, "
        f"model {trace.model} (recorded from {trace.header.get('engine', '?')})"
    )
    if args.name is not None:
        if args.model or args.device:
            raise ConfigurationError(
                "--name replays on that daemon's model: no --model or --device"
            )
        with connect(args.name) as client:
            print(f"replaying through daemon {args.name!r} (model {client.manifest.model})")
            result = replay_client(trace, client)
    else:
        model = _model(trace, args.model, args.device)
        identity = model.state_identity()
        print(f"replaying in process: {identity or model.manifest().model}")
        recorded = trace.header["model"].get("identity")
        if recorded and identity and recorded.get("digest") != identity.digest:
            print(f"note: recorded on {recorded.get('name')} (digest {recorded.get('digest')})")
        engine = ComposedEngine(model)
        try:
            result = replay_engine(trace, engine)
        finally:
            engine.close()
    return _report(result)


def _model(trace: Trace, name: str | None, device: str | None) -> StageModel:
    """The replay's model: ``name`` or the trace's, with the trace's rows, on ``device``."""
    spec = name or trace.model
    device = device or trace.header.get("device")
    settings: dict[str, Any] = {"max_sessions": int(trace.manifest["max_sessions"])}
    if device not in (None, "cpu"):
        settings["device"] = device
    try:
        return load_model(spec, **settings)
    except (TypeError, ValueError, ImportError, AttributeError) as exc:
        raise ConfigurationError(f"--model {spec}: {exc}") from None


def _report(result: Replayed) -> int:
    pace = result.pace
    speed = f"{result.speed:.0f} chunks/s flat out"
    if pace:
        speed += f", {result.speed / pace:.1f}x the trace's pace ({pace:.1f} chunks/s)"
    if result.divergence is None:
        print(f"identical, {result.chunks} chunks")
        print(f"replayed at {speed}")
        return 0
    print(f"diverged at {result.divergence}")
    print(f"({result.chunks} chunks identical before it; replayed at {speed})")
    return 1
