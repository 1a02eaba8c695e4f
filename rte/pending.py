"""Pending actions: what each session's client asked for since its last step.

A session steps at its own pace, its client acts at its own: the actions that
arrive between two of its steps merge (a later value of a key replaces an
earlier one) and the step takes them whole, with the ``seq`` of the last one
that came (the receipt its chunk carries: :mod:`rte.receipts`). A session
that nobody acted on steps with no action. :class:`rte.serve.ServeLoop` holds
one; a checkpoint (:meth:`rte.serve.ServeLoop.host_state`) saves a session's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rte.contract import Action


class PendingActions:
    """The actions of each session not yet taken by a step, and their last seq."""

    def __init__(self) -> None:
        self._conditioning: dict[str, dict[str, Any]] = {}
        self._seqs: dict[str, int] = {}  # the last seq of each session's pending actions

    def put(self, session: str, conditioning: Mapping[str, Any], seq: int) -> None:
        """An action for ``session`` arrived (merged into what is pending)."""
        self._conditioning.setdefault(session, {}).update(conditioning)
        self._seqs[session] = seq

    def take(self, due: list[str]) -> tuple[dict[str, Action] | None, dict[str, int] | None]:
        """The pending actions of the ``due`` sessions and their seqs, taken (None,
        None while nobody has acted)."""
        pending = self._conditioning
        if not pending:
            return None, None
        actions = {s: Action(pending.pop(s)) for s in due if s in pending}
        return actions, {s: self._seqs.pop(s, 0) for s in actions}

    def of(self, session: str) -> tuple[dict[str, Any], int]:
        """What is pending for ``session`` (a copy) and its seq (0: nothing)."""
        return dict(self._conditioning.get(session, {})), self._seqs.get(session, 0)

    def forget(self, session: str) -> None:
        """``session`` detached: what it had pending goes."""
        self._conditioning.pop(session, None)
        self._seqs.pop(session, None)
