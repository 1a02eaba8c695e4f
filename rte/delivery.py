"""Step 4 of the serve loop: what an engine call's results become in its outbox.

An engine call (a step, a finalize) returns one :class:`~rte.contract.StepResult`
per session; the loop hands its host values, never exceptions, so each result
becomes an outbox item here. :class:`Delivery` stamps each result with its
receipt (:mod:`rte.receipts`: the seq of the last action it applied) when the
host asks for that, then makes the chunks into the host's own form (``emit``:
default the CHUNK results themselves; the daemon's are the slab leases that
hold them) and each result that carries no chunk into a notice: an ERROR says
what went wrong for that session; a FAILED session's engine let it go, so after
its ERROR notice the session is detached (``let_go``, the loop's detach), in
the order the results came.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rte.contract import Notice, NoticeKind, ResultKind, StepResult
from rte.receipts import Receipts

# what a loop's calls return: chunks (each a StepResult, or a host's own form of
# an engine call's chunks: see ``emit``) and notices
OutboxItem = StepResult | Notice | object
# a fresh list (the loop appends to it) and the number of chunks it holds
Emit = Callable[[Sequence[StepResult]], tuple[list[Any], int]]
LetGo = Callable[[str, str, list[OutboxItem]], object]  # session, reason, out


class Delivery:
    """An engine call's results as outbox items.

    Args:
        receipts: the loop's receipts, which stamp each result.
        stamp: whether results carry ``applied``.
        emit: what stands for an engine call's chunks (default: the CHUNK results),
            and how many chunks that holds.
        let_go: detaches a session whose own failure the engine reported (FAILED),
            appending its notices to the list it is given.
    """

    def __init__(self, receipts: Receipts, stamp: bool, emit: Emit | None, let_go: LetGo) -> None:
        self.receipts = receipts
        self.stamp = stamp
        self.emit = emit
        self.let_go = let_go

    def __call__(self, results: Sequence[StepResult]) -> list[OutboxItem]:
        """The outbox items of one engine call's ``results``, in their order."""
        if self.stamp:
            results = self.receipts.stamp(results)
        chunk = ResultKind.CHUNK
        if self.emit is None:
            out: list[OutboxItem] = [r for r in results if r.kind is chunk]
            emitted = len(out)
        else:  # (which says how many chunks it holds: no look at each result)
            out, emitted = self.emit(results)
        if emitted < len(results):  # some carry no chunk: their errors become notices
            for r in results:
                if r.kind is ResultKind.ERROR:
                    out.append(Notice(r.session, NoticeKind.ERROR, r.error or ""))
                elif r.kind is ResultKind.FAILED:  # its own failure: the engine let it go
                    out.append(Notice(r.session, NoticeKind.ERROR, r.error or ""))
                    self.let_go(r.session, r.error or "", out)
        return out
