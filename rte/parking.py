"""Parking: attached sessions out of their engine's rows, their states in host memory.

A serving loop (:class:`rte.serve.ServeLoop`) parks a session by suspending it
in its engine (:meth:`rte.composed.ComposedEngine.suspend`: the row freed, the
state returned) and keeps the :class:`~rte.state.SessionState` here. The
session stays attached as far as the loop and its clients know (its id is
taken, its owner, credits, priority and queued actions are the loop's and stay
there), so nothing has to travel with the state within one host; a resume
(:meth:`Parking.resume`) gives it a row again at a step boundary and it goes on
at its next chunk index, its frames those of a twin never parked.

Two ways in, one budget:

* **suspended** by its client (a :class:`~rte.protocol.requests.Suspend`): it
  stays parked until a :class:`~rte.protocol.requests.Resume`; acting on it is
  refused meanwhile (there is no row to check an action against);
* **idle** (``idle_s`` > 0): a session that was not due (its consumer released
  nothing) for ``idle_s`` is parked by the loop and resumed when it is due again
  or acted on, so a host can hold more attached sessions than rows (a daemon's
  one client up to its session handles, ``--sessions-per-client``: a parked
  session keeps its handle, :mod:`rte.ipc.settings`).

The states held are bounded by ``budget_bytes`` (their arrays,
:attr:`SessionState.nbytes`): a park past it is an
:class:`~rte.errors.AdmissionError` and the session goes on in its row.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rte.contract import Notice, NoticeKind
from rte.errors import AdmissionError, EngineFault, RequestError, StateError
from rte.state import SessionState

DEFAULT_PARK_BYTES = 256 << 20


@dataclass(frozen=True)
class Parked:
    """One parked session: its state, and whether its client asked (else: idle)."""

    state: SessionState
    asked: bool
    since: float  # time.monotonic() when it was parked

    @property
    def nbytes(self) -> int:
        return self.state.nbytes


class Parking:
    """The parked sessions of one engine, within a byte budget.

    Args:
        engine: the engine whose sessions are parked (``suspend``/``resume``).
        budget_bytes: the most bytes of state held at once (0: parking refused).
        idle_s: park a session not due for this long (0: never by idleness).
    """

    def __init__(self, engine: Any, budget_bytes: int = DEFAULT_PARK_BYTES, idle_s: float = 0.0):
        self.engine = engine
        self.budget_bytes = budget_bytes
        self.idle_s = idle_s
        self.parked: dict[str, Parked] = {}
        self._last_due: dict[str, float] = {}

    @property
    def nbytes(self) -> int:
        """The bytes of every state held."""
        return sum(p.nbytes for p in self.parked.values())

    @property
    def can_park(self) -> bool:
        return bool(getattr(self.engine, "can_suspend", False))

    def __contains__(self, session: object) -> bool:
        return session in self.parked

    def asked(self, session: str) -> bool:
        """Whether ``session`` is parked because its client suspended it."""
        parked = self.parked.get(session)
        return parked is not None and parked.asked

    def park(self, session: str, *, asked: bool) -> None:
        """Suspend ``session`` in the engine and hold its state. StateError (the
        session stays in its row) when the engine cannot; AdmissionError when the
        budget cannot hold the state (the session is resumed in place)."""
        held = self.parked.get(session)
        if held is not None:  # (a client's suspend of an idle-parked one: now it asked)
            self.parked[session] = Parked(held.state, held.asked or asked, held.since)
            return
        if self.budget_bytes <= 0:
            raise AdmissionError(
                f"session {session!r} not suspended: this host parks no sessions "
                "(--park-bytes 0); start it with a --park-bytes budget"
            )
        state = self._suspend(session)
        total = self.nbytes + state.nbytes
        if total > self.budget_bytes:
            self.engine.resume(session, state)  # at the same boundary: nothing was lost
            raise AdmissionError(
                f"session {session!r} not suspended: its state of {state.nbytes:,} bytes "
                f"would hold {total:,} bytes parked, past the budget of "
                f"{self.budget_bytes:,} (--park-bytes); resume or detach another, or "
                "raise --park-bytes"
            )
        self.parked[session] = Parked(state, asked, time.monotonic())

    def _suspend(self, session: str) -> SessionState:
        suspend = getattr(self.engine, "suspend", None)
        if suspend is None or not self.can_park:
            raise StateError(
                f"session {session!r} cannot be suspended: this engine's model does not "
                "export its sessions' state (engine.can_suspend is False); detach it instead"
            )
        state: SessionState = suspend(session)
        return state

    def export(
        self, session: str, into: Callable[[SessionState], int], host: dict[str, Any]
    ) -> int:
        """Hand ``session``'s state, with the loop's ``host`` half, to ``into``
        (suspending it first unless parked; outside the budget: it is leaving) and
        hold it parked, rowless, for its detach; the bytes ``into`` says it holds.
        What ``into`` raises (a state too big for it) leaves the session as it was."""
        if not callable(into):
            raise RequestError(f"export of {session!r}: nowhere to put its state")
        held = self.parked.get(session)
        state = held.state if held is not None else self._suspend(session)
        try:
            nbytes = into(dataclasses.replace(state, host=host))
        except BaseException:
            if held is None:
                self.engine.resume(session, state)  # at the same boundary: nothing lost
            raise
        self.parked[session] = Parked(state, True, time.monotonic())
        return nbytes

    def resume(self, session: str) -> None:
        """Give ``session`` a row again; AdmissionError (it stays parked) when none
        is free, StateError (it stays parked) if the engine refuses its state."""
        held = self.parked[session]
        self.engine.resume(session, held.state)
        del self.parked[session]
        self._last_due[session] = time.monotonic()

    def bring_back(self, session: str, seq: int, out: list[Any], *, quiet: bool = False) -> bool:
        """Resume ``session`` (a RESUMED into ``out``); False while no row is free
        (REJECTED into ``out`` unless ``quiet``: it stays parked). RequestError for
        a session not parked."""
        if session not in self.parked:
            raise RequestError(f"session {session!r} cannot resume: it is not suspended")
        try:
            self.resume(session)
        except AdmissionError as exc:
            if not quiet:
                out.append(Notice(session, NoticeKind.REJECTED, f"{exc}; it stays suspended", seq))
            return False
        out.append(Notice(session, NoticeKind.RESUMED, "", seq))
        return True

    def park_idle(self, sessions: list[str]) -> list[Notice]:
        """Park those of ``sessions`` idle for ``idle_s``; a SUSPENDED notice for each
        (one that cannot be parked stays in its row, and is not retried at once)."""
        out = []
        now = time.monotonic()
        for session in self.idle(sessions, now):
            try:
                self.park(session, asked=False)
            except EngineFault:
                raise
            except Exception:  # past the budget, or refused: it stays in its row
                self._last_due[session] = now
                continue
            why = f"idle: consumed nothing for {self.idle_s:g}s; an action or a release resumes it"
            out.append(Notice(session, NoticeKind.SUSPENDED, why))
        return out

    def drop(self, session: str) -> bool:
        """Forget ``session`` (detached); whether it was parked."""
        self._last_due.pop(session, None)
        return self.parked.pop(session, None) is not None

    def runnable(self, due: list[str]) -> list[str]:
        """``due`` without the sessions their clients suspended (an idle-parked
        one is runnable: its step resumes it)."""
        if not self.parked:
            return due
        return [s for s in due if not self.asked(s)]

    def take_due(self, due: list[str], out: list[Any]) -> list[str]:
        """Of ``due``, those that step now: not the suspended, and the idle-parked
        resumed (RESUMED into ``out``; one with no row free yet stays parked, not
        due), each noted as due now."""
        due = self.runnable(due)
        if self.parked:
            for session in [s for s in due if s in self.parked]:  # idle-parked, due again
                if not self.bring_back(session, 0, out, quiet=True):
                    due.remove(session)  # no row yet: it stays parked
        self.seen_due(due, time.monotonic())
        return due

    def seen_due(self, due: list[str], now: float) -> None:
        """Note that ``due`` were due now (not idle)."""
        if self.idle_s:
            self._last_due.update(dict.fromkeys(due, now))

    def idle(self, sessions: list[str], now: float) -> list[str]:
        """The sessions in rows not due for ``idle_s`` (none when parking by
        idleness is off or the engine cannot park)."""
        if not self.idle_s or not self.can_park or self.budget_bytes <= 0:
            return []
        last = self._last_due
        out = []
        for session in sessions:
            if session in self.parked:
                continue
            seen = last.setdefault(session, now)
            if now - seen >= self.idle_s:
                out.append(session)
        return out
