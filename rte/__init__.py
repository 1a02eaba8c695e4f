"""rte: a standalone realtime inference engine for chunked, action-steered models.

This package is the engine alone, usable in one process: the contract, the
batching machinery, the lanes, the replica engine, the Level-2 serve loop and
the shipped models. Importing it never imports torch (the CPU path runs on
NumPy alone) nor the shared-memory transport (``shm``); the daemon side lives
in :mod:`rte.ipc`, the clients in :mod:`rte.client`, the commands in
:mod:`rte.cli`.
"""

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
    UnknownSessionError,
)
from rte.lanes import Lane
from rte.replica import ReplicaEngine
from rte.serve import Act, Attach, Detach, Reset, ServeLoop, Stop, Wake, default_serve

__version__ = "0.1.0"  # the one place: pyproject.toml reads it
from rte.stages import Batch, HeapAllocator, OutputAllocator, Stage, StageModel

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
    "Notice",
    "NoticeKind",
    "OutputAllocator",
    "ReplicaEngine",
    "RequestError",
    "RequestTimeout",
    "Reset",
    "ResultKind",
    "RteError",
    "ServeLoop",
    "Stage",
    "StageModel",
    "StepResult",
    "Stop",
    "Timing",
    "UnknownSessionError",
    "Wake",
    "__version__",
    "conditioning_equal",
    "default_serve",
]
