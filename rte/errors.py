"""The engine's errors: one hierarchy rooted in :class:`RteError`.

Each docstring says when the error is raised. A stage's own exception is never
wrapped: it propagates unchanged, after the engine has drained its lanes.
"""

from __future__ import annotations


class RteError(Exception):
    """Base class of every error the engine raises itself."""


class AdmissionError(RteError):
    """An attach was refused: the arena is full, or the engine refuses arrivals
    while a cohort runs (``midrun_attach=False``).

    This is backpressure, never a silent drop: nothing was attached, and the
    caller may retry after a detach.
    """


class UnknownSessionError(RteError):
    """A call named a session that is not attached to this engine."""


class EngineClosedError(RteError):
    """The engine was closed; no further calls are accepted."""
