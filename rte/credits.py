"""Credits and quotas: the one rule both hosts hold a client's run-ahead to.

A session may have at most its *credits* of chunks emitted and not yet
released (run-ahead is explicit); a client may hold at most its *quota* of
chunks in all. The quota is what one client driving every row needs
(:func:`chunks_to_drive`: every row's credits plus one in flight), so by
default a client is never throttled by its quota. A client whose sessions
ask for more credits than its quota can hold would be throttled silently
(its sessions would stall for slots, not for credit), so the attach that
would cause it is refused, saying why and what to change
(:func:`credit_refusal`). The daemon (``rte.ipc``) and the in-process client
(:mod:`rte.client.inprocess`) both apply it.
"""

from __future__ import annotations


def chunks_to_drive(rows: int, credits: int) -> int:
    """Chunks one client holds at most while it drives ``rows`` sessions at full
    rate, each ``credits`` ahead: their credits, plus one per row in flight."""
    return rows * (credits + 1)


def credit_refusal(held: int, asked: int, quota: int, fix: str) -> str | None:
    """Why an attach asking ``asked`` credits may not be bound by a client whose
    sessions hold ``held`` credits already, under ``quota`` (None: it may).
    ``fix`` says how to give the client a larger quota."""
    if held + asked <= quota:
        return None
    return (
        f"credits {asked} for this session would let this client's sessions run "
        f"{held + asked} chunks ahead, more than its quota of {quota} slots, so they "
        f"would stall for slots, not for credit: attach with fewer credits, or {fix}"
    )
