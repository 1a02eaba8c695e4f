"""Every public error of rte: one hierarchy rooted in :class:`RteError`.

Each docstring says when the error is raised and which sibling you get
otherwise (after trio's ``ClosedResourceError`` / ``BrokenResourceError``).
The split a caller cares about:

- :class:`RequestError` (and :class:`AdmissionError`): *this request* was
  refused; nothing changed and the client or engine stays usable.
- :class:`RequestTimeout`: no answer in time; the request may still take effect.
- :class:`EngineGone`: the engine is gone; nothing more can be done on this
  client. :class:`ClientClosedError`: you closed it yourself.

A stage's own exception is never wrapped by the engine: it propagates
unchanged, after the engine has drained its lanes. The transport's own errors
(``shm.ShmError``) never escape a client; they become one of these.
"""

from __future__ import annotations


class RteError(Exception):
    """Base class of every error rte raises itself."""


class RequestError(RteError):
    """A request was refused: a malformed or unsendable value, conditioning the
    model rejects, an unknown session, or another client's session.

    Nothing changed; the engine (or client) stays usable. An attach refused for
    capacity is :class:`AdmissionError` instead.
    """


class UnknownSessionError(RequestError):
    """A call named a session that is not attached to this engine."""


class WireError(RequestError):
    """A record or value does not follow the wire format.

    Raised in a client before it sends a value that cannot cross a process
    boundary (an object array, a non-str key); inside the daemon, hostile bytes
    raise it and their sender gets it back as an ``ERROR`` notice.
    """


class StateError(RequestError):
    """A session's state was refused: a suspend on a model that cannot export its
    rows (``engine.can_suspend`` is False), a resume of a state of another model,
    configuration or format version, or bytes that are not a state (torn, garbled).

    Nothing changed: a session refused a suspend stays attached, a refused resume
    took no row. A resume refused for capacity is :class:`AdmissionError` instead.
    """


class AdmissionError(RteError):
    """An attach (or a connect) was refused for capacity: every row (or every
    client slot) is in use, or the engine refuses arrivals while a cohort runs
    (``midrun_attach=False``).

    This is backpressure, never a silent drop: nothing was attached, and the
    caller may retry after a detach. Other refusals are :class:`RequestError`.
    """


class RequestTimeout(RteError, TimeoutError):
    """A call got no answer within its timeout, or could not even be sent in
    it because the daemon is not taking requests (its inbox stayed full).

    The request may still take effect later. Also a builtin ``TimeoutError``.
    If the daemon died instead, you get :class:`EngineGone`.
    """


class EngineGone(RteError):
    """The engine serving this client died or stopped (a daemon killed or shut
    down, an in-process serve loop that ended).

    Unrecoverable for this client: close it and connect again once an engine
    runs. A client you closed yourself raises :class:`ClientClosedError`.
    """


class ClientClosedError(RteError):
    """A call on a client after its ``close()``. The engine may be fine; this
    client is not usable any more. Compare :class:`EngineGone`."""


class EngineClosedError(RteError):
    """A call on an in-process engine after its ``close()``."""


class EngineFault(EngineClosedError):
    """The engine's device failed and stays failed (a sticky CUDA error, such as
    an illegal memory access): the engine discarded its in-flight output and
    refuses every call. A daemon fails closed on it: its clients get
    :class:`EngineGone` with the device's error."""


class ConfigurationError(RteError, ValueError):
    """A daemon was asked to start with settings that cannot hold: a bad name, a
    model that cannot be loaded, sizes that do not fit together. Nothing was
    created; ``rte serve`` says which setting and exits 2. Also a ValueError."""


class DaemonRunningError(RteError):
    """``rte serve`` found a live daemon of the same name owning the shared
    memory; the new one refuses to start (exit code 2) and the first runs on."""
