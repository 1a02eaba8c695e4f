"""A daemon's rows as its roster shows them (rte.protocol.rows): the one reading of it."""

from __future__ import annotations

from rte.protocol.claims import ClientEntry, ClientState
from rte.protocol.rows import held_rows


def _entry(index: int, state: ClientState, sessions: int) -> ClientEntry:
    return ClientEntry(index, state, 1, 100 + index, 0.0, sessions)


def test_only_active_clients_hold_rows() -> None:
    entries = [
        _entry(0, ClientState.ACTIVE, 3),
        _entry(1, ClientState.CLOSING, 5),  # being removed: its sessions are detached
        _entry(2, ClientState.REVOKED, 7),  # disconnected: its sessions are gone
        _entry(3, ClientState.FREE, 0),
        _entry(4, ClientState.ACTIVE, 2),
    ]
    assert held_rows(entries) == 5
    assert held_rows([]) == 0
