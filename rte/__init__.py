"""rte: a standalone realtime inference engine for chunked, action-steered models.

This package is the engine alone, usable in one process: the contract, the
batching machinery, the lanes, the replica engine, the Level-2 serve loop and
the shipped models. Importing it never imports torch (the CPU path runs on
NumPy alone) nor the shared-memory transport (``shm``); the daemon side lives
in :mod:`rte.ipc`, the clients in :mod:`rte.client`, the commands in
:mod:`rte.cli`.

Its names are imported when first used (PEP 562), so ``import rte`` alone, as the
``rte`` command does before it handles Ctrl-C, costs nothing: a Ctrl-C in the
first moments of a command is its one line, not a traceback from NumPy's import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # the one place: pyproject.toml reads it

if TYPE_CHECKING:
    from rte.composed import ComposedEngine
    from rte.conditioning import conditioning_equal
    from rte.contract import (
        Action,
        Engine,
        Manifest,
        Notice,
        NoticeKind,
        ResultKind,
        StepResult,
        Timing,
    )
    from rte.errors import (
        AdmissionError,
        ClientClosedError,
        EngineClosedError,
        EngineFault,
        EngineGone,
        RequestError,
        RequestTimeout,
        RteError,
        StateError,
        UnknownSessionError,
    )
    from rte.lanes import Lane
    from rte.output import HeapAllocator, OutputAllocator
    from rte.protocol.requests import Act, Attach, Detach, Reset, Stop, Wake
    from rte.replica import ReplicaEngine
    from rte.serve import ServeLoop, default_serve
    from rte.stages import Batch, Stage, StageModel
    from rte.state import ModelIdentity, RowState, SessionState

_HOMES = {
    "ComposedEngine": "rte.composed",
    "conditioning_equal": "rte.conditioning",
    "Action": "rte.contract",
    "Engine": "rte.contract",
    "Manifest": "rte.contract",
    "Notice": "rte.contract",
    "NoticeKind": "rte.contract",
    "ResultKind": "rte.contract",
    "StepResult": "rte.contract",
    "Timing": "rte.contract",
    "AdmissionError": "rte.errors",
    "ClientClosedError": "rte.errors",
    "EngineClosedError": "rte.errors",
    "EngineFault": "rte.errors",
    "EngineGone": "rte.errors",
    "RequestError": "rte.errors",
    "RequestTimeout": "rte.errors",
    "RteError": "rte.errors",
    "UnknownSessionError": "rte.errors",
    "StateError": "rte.errors",
    "SessionState": "rte.state",
    "ModelIdentity": "rte.state",
    "RowState": "rte.state",
    "Lane": "rte.lanes",
    "ReplicaEngine": "rte.replica",
    "Act": "rte.protocol.requests",
    "Attach": "rte.protocol.requests",
    "Detach": "rte.protocol.requests",
    "Reset": "rte.protocol.requests",
    "ServeLoop": "rte.serve",
    "Stop": "rte.protocol.requests",
    "Wake": "rte.protocol.requests",
    "default_serve": "rte.serve",
    "Batch": "rte.stages",
    "HeapAllocator": "rte.output",
    "OutputAllocator": "rte.output",
    "Stage": "rte.stages",
    "StageModel": "rte.stages",
}


def __getattr__(name: str) -> Any:
    """``rte.ComposedEngine`` and the rest, imported from their module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rte' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = [
    "Act",
    "Action",
    "AdmissionError",
    "Attach",
    "Batch",
    "ClientClosedError",
    "ComposedEngine",
    "Detach",
    "Engine",
    "EngineClosedError",
    "EngineFault",
    "EngineGone",
    "HeapAllocator",
    "Lane",
    "Manifest",
    "ModelIdentity",
    "Notice",
    "NoticeKind",
    "OutputAllocator",
    "ReplicaEngine",
    "RequestError",
    "RequestTimeout",
    "Reset",
    "ResultKind",
    "RowState",
    "RteError",
    "ServeLoop",
    "SessionState",
    "Stage",
    "StageModel",
    "StateError",
    "StepResult",
    "Stop",
    "Timing",
    "UnknownSessionError",
    "Wake",
    "__version__",
    "conditioning_equal",
    "default_serve",
]
