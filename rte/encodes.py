"""Encodes: a ComposedEngine's heavy conditioning changes, on the ENCODE lane.

An action's change of a heavy key is staged on its row (``Row.staged``). At a
step boundary the rows with staged changes start one encode together
(:meth:`Encodes.start`) and sit out until it completes; :meth:`Encodes.settle`
then gives each row its new values.

An encode that fails is its rows' failure, nobody else's: a row of a batch
is encoded again alone, to find whose failure it was, and a row whose encode
fails alone is handed back as failed (the engine detaches it; every other
session goes on without losing a chunk). The happy path pays nothing for it:
one encode per step's changes, as before, and a set entry per row encoding alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rte.arena import Row
from rte.lanes import Lanes
from rte.stages import Batch, Stage

BatchOf = Callable[[list[Row], list[dict[str, Any]]], Batch]


class Encodes:
    """The encodes of one engine's rows.

    Args:
        lanes: the engine's lanes (``submit_encode``).
        stages: the model's ENCODE stages, run in order on each encode's batch.
        batch_of: the engine's batch of some rows with the given conditioning.
    """

    def __init__(self, lanes: Lanes, stages: Sequence[Stage], batch_of: BatchOf) -> None:
        self._lanes = lanes
        self._stages = stages  # the engine's own list, not a copy
        self._batch_of = batch_of
        self._alone: set[Row] = set()  # rows whose encode under way is theirs alone

    def start(self, rows: Iterable[Row]) -> bool:
        """Start one encode of the staged changes of ``rows`` (those armed and not
        encoding already); whether one started."""
        starting = [r for r in rows if r.armed and r.staged and r.encoding is None]
        if not starting:
            return False
        for r in starting:
            r.encoding_values, r.staged = r.staged, {}
        self._submit(starting)
        return True

    def settle(self, rows: Iterable[Row]) -> tuple[bool, list[tuple[Row, str]]]:
        """Settle the completed encodes of ``rows``: whether any completed, and the
        rows whose own encode failed, with why (their change is dropped)."""
        settled, failed = False, []
        done = [(r, r.encoding) for r in rows if r.encoding is not None and r.encoding.done()]
        for r, encode in done:
            settled, values = True, r.encoding_values
            try:
                encode.result()
            except Exception as exc:
                if r not in self._alone:  # one of a batch: encoded again alone, to find whose
                    self._submit([r])
                    continue
                failed.append((r, f"its encode failed: {type(exc).__name__}: {exc}"))
            else:
                r.conditioning = {**r.conditioning, **values}  # replaced: batches hold the old
            self._alone.discard(r)
            r.encoding, r.encoding_values = None, {}
        return settled, failed

    def finish(self, row: Row) -> tuple[bool, list[tuple[Row, str]]]:
        """Wait for the encode of ``row`` under way (and for its retry alone, if it was
        a batch's that failed) and settle it, as :meth:`settle` says."""
        settled_any, failed = False, list[tuple[Row, str]]()
        while row.encoding is not None and not failed:
            with contextlib.suppress(Exception):  # its failure is settled below
                row.encoding.result()
            settled, failed = self.settle([row])
            settled_any = settled_any or settled
        return settled_any, failed

    def forget(self, row: Row) -> None:
        """``row`` left the engine (its encode, if any, completes unread)."""
        self._alone.discard(row)

    def _submit(self, rows: list[Row]) -> None:
        values = [dict(r.encoding_values) for r in rows]
        completion = self._lanes.submit_encode(self._run, self._batch_of(rows, values))
        for r in rows:
            r.encoding = completion
        if len(rows) == 1:
            self._alone.add(rows[0])

    def _run(self, batch: Batch) -> None:
        for stage in self._stages:
            stage.fn(batch)
