"""rte: a standalone realtime inference engine for chunked, action-steered models.

Importing rte never imports torch; the CPU path runs on NumPy alone.
"""

from rte.composed import Batch, ComposedEngine, HeapAllocator, OutputAllocator, Stage, StageModel
from rte.conditioning import conditioning_equal
from rte.contract import Action, Engine, Manifest, ResultKind, StepResult, Timing
from rte.errors import AdmissionError, EngineClosedError, RteError, UnknownSessionError
from rte.lanes import Lane
from rte.replica import ReplicaEngine
from rte.serve import Act, Attach, Detach, Notice, NoticeKind, Reset, Stop, default_serve

__all__ = [
    "Act",
    "Action",
    "AdmissionError",
    "Attach",
    "Batch",
    "ComposedEngine",
    "Detach",
    "Engine",
    "EngineClosedError",
    "HeapAllocator",
    "Lane",
    "Manifest",
    "Notice",
    "NoticeKind",
    "OutputAllocator",
    "ReplicaEngine",
    "Reset",
    "ResultKind",
    "RteError",
    "Stage",
    "StageModel",
    "StepResult",
    "Stop",
    "Timing",
    "UnknownSessionError",
    "conditioning_equal",
    "default_serve",
]
