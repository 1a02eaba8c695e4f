"""Intake: a client's requests, from its inbox ring to the serve loop and back.

Step 2 of the core's turn, for one connection: every record its inbox holds
is decoded and judged before the shared :class:`~rte.serve.ServeLoop` sees
it, and whatever comes of it is delivered at once, so a bad record is an
ERROR for its sender only and nothing one client sends ends the loop:

1. a record that does not decode is refused (its seq read back if it can be);
   a BYE removes the client (:class:`~rte.ipc.departures.Departures`); a
   DRAIN drains the daemon (:class:`~rte.ipc.draining.Draining`);
2. the :class:`~rte.ipc.router.Router` refuses what the sender may not do
   (another client's session, credits past its quota); a session still being
   detached after its client left (an orphan) refuses every request; a
   draining daemon REJECTS the attach of a new session;
3. a DETACH or RESET whose owner has no slab slot for the in-flight chunk
   does not finalize (the owner is told it is dropped);
4. inputs lent by slot become read-only views of the sender's own input
   slots (:class:`~rte.ipc.inputs.Inputs`): a stale reference is refused and
   holds nothing; which slots a session's conditioning now holds is tracked
   after the loop took, refused or ignored the request;
5. the loop's answers go out (an ATTACHED binds the session with the credits
   its request asked for; a RESET keeps the credits it had), and the
   client's session count is published for inspectors.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Container

from rte.contract import Notice, NoticeKind
from rte.ipc.clients import ClientTable, Connection
from rte.ipc.departures import Departures
from rte.ipc.draining import Draining
from rte.ipc.inputs import InputRefused, Inputs
from rte.ipc.outbound import Outbound
from rte.ipc.router import Router
from rte.protocol.control import Control, Counter
from rte.protocol.drain import Drain
from rte.protocol.inputs import conditioning_of, with_conditioning
from rte.protocol.requests import STATE_KEY, Act, Attach, Detach, Request, Reset
from rte.protocol.wire import Bye, decode_request, request_seq
from rte.serve import OutboxItem, ServeLoop
from shm import RingCorrupt
from shm.slab import Sample

log = logging.getLogger("rte.daemon")
_COMINGS = {NoticeKind.ATTACHED, NoticeKind.DETACHED}
_LOGGED = {*_COMINGS, NoticeKind.ERROR, NoticeKind.REJECTED}


class Intake:
    """Takes each connection's requests to the serve loop, and its answers back."""

    def __init__(
        self,
        control: Control,
        loop: ServeLoop,
        table: ClientTable,
        router: Router,
        inputs: Inputs,
        out: Outbound,
        departures: Departures,
        draining: Draining,
    ) -> None:
        self.control = control
        self.loop = loop
        self.table = table
        self.router = router
        self.inputs = inputs
        self.out = out
        self.departures = departures
        self.draining = draining

    def drain(self, connection: Connection) -> None:
        """Every request ``connection``'s inbox holds, in order (until it says BYE)."""
        try:
            records = connection.inbox.pop_batch_nowait()
        except RingCorrupt:
            connection.inbox.reset()
            self.out.send(connection, Notice("", NoticeKind.ERROR, "RingCorrupt: inbox was reset"))
            return
        for raw in records:
            self.control.count(Counter.REQUESTS)
            self._request(connection, raw)
            if connection.index not in self.table.connections:
                return  # it said BYE

    def _refuse(self, connection: Connection, message: Request, text: str) -> None:
        log.warning("client %d: refused: %s", connection.index, text)
        self.out.send(connection, Notice(message.session, NoticeKind.ERROR, text, message.seq))
        self.control.count(Counter.ERRORS)

    def _request(self, connection: Connection, raw: bytes) -> None:
        try:
            message = decode_request(raw)
        except Exception as exc:  # WireError; anything else is a decoder bug, refused alike
            text = f"{type(exc).__name__}: {exc}"
            log.warning("client %d: a record refused: %s", connection.index, text)
            self.out.deliver([Notice("", NoticeKind.ERROR, text, request_seq(raw))], connection)
            return
        if isinstance(message, Bye):
            log.info("client %d (pid %d) left", connection.index, connection.pid)
            self.departures.reap(connection)
            return
        if isinstance(message, Drain):
            self.draining.begin(connection, message)
            return
        refusal = self.router.refuse(connection, message)
        # no handle left: said before its credits are judged (they could not be bound)
        no_handle = isinstance(message, Attach) and self._out_of_handles(connection, message)
        if isinstance(message, Attach) and (refusal is None or no_handle):
            moved_in = STATE_KEY in message.conditioning
            rejected = self.draining.refusal(connection, message.session, moved_in)
            if rejected is None and no_handle:
                rejected = _no_handle(connection, message.session, self.loop.parking.parked)
            if rejected is not None:
                notice = Notice(message.session, NoticeKind.REJECTED, rejected, message.seq)
                self.out.send(connection, notice)
                self.inputs.unused(connection.index, conditioning_of(message))
                return
        if message.session in self.departures.orphans:
            refusal = f"session {message.session!r} is being detached; try again later"
        if refusal is not None:
            self._refuse(connection, message, refusal)
            self.inputs.unused(connection.index, conditioning_of(message))
            return
        if isinstance(message, Detach | Reset) and not self.departures.room_to_finalize(
            message.session
        ):
            message = dataclasses.replace(message, finalize=False)
        try:  # inputs lent by slot: read-only views of the client's slots
            resolved, samples = self.inputs.resolve(connection.index, conditioning_of(message))
            message = self.inputs.export_into(connection.index, message)  # (an Export's slot)
        except InputRefused as exc:
            self._refuse(connection, message, str(exc))
            return
        if samples:
            message = with_conditioning(message, resolved or {})
        # an attach of a session this client has already: the engine keeps what it had
        again = isinstance(message, Attach) and message.session in connection.sessions
        credits = 0  # what an ATTACHED binds the session with (0: the default)
        if isinstance(message, Attach):
            credits = message.credits
        elif isinstance(message, Reset) and message.session in connection.handles:
            credits = int(connection.credits[connection.handles[message.session]])
        answers = self.loop.handle(message)
        if not answers and type(message) is Act and connection.figures is not None:
            handle = connection.handles[message.session]  # timed to its photon
            connection.figures.acted(handle, message.seq, time.monotonic_ns())
        _log_answers(connection, answers)
        if self.inputs.by_slot:
            self._track_inputs(message, answers, samples, again)
        self.out.deliver(answers, connection, credits)
        self.table.publish_sessions(connection)

    def _out_of_handles(self, connection: Connection, attach: Attach) -> bool:
        """Whether ``attach`` of a session no client holds would find no free session
        handle of ``connection`` (its mailbox has ``--sessions-per-client``; parked
        sessions keep theirs). One held already is the router's or the loop's; a
        client whose sessions fill every row, none parked, hears that from the loop
        (the rows are in use: an attach that waits asks again)."""
        if attach.session in connection.handles or self.router.owner(attach.session):
            return False
        if len(connection.handles) < len(connection.names):
            return False
        parked = self.loop.parking.parked
        return len(connection.names) < self.control.manifest().max_sessions or any(
            s in parked for s in connection.handles
        )

    def _track_inputs(
        self, message: Request, answers: list[OutboxItem], samples: dict[str, Sample], again: bool
    ) -> None:
        """Which input slots the session's conditioning now holds, after the loop
        took (or refused, or, ``again``, ignored) ``message``."""
        if again:
            self.inputs.refused(samples)
            return
        for answer in answers:
            if (
                isinstance(answer, Notice)
                and answer.seq == message.seq
                and answer.kind in (NoticeKind.ERROR, NoticeKind.REJECTED)
            ):
                self.inputs.refused(samples)
                return
        conditioning = conditioning_of(message)
        if isinstance(message, Detach) or (isinstance(message, Reset) and conditioning is not None):
            self.inputs.drop(message.session)
        if conditioning:
            self.inputs.taken(message.session, conditioning, samples)


def _no_handle(connection: Connection, session: str, parked: Container[str]) -> str:
    """Why ``session``'s attach is refused: ``connection`` holds a session on every
    handle of its mailbox (``parked``: the loop's parked sessions, some maybe its)."""
    held = len(connection.handles)
    some = sum(1 for s in connection.handles if s in parked)
    return (
        f"session {session!r} refused: this client holds {held} sessions"
        f"{f' ({some} parked)' if some else ''}, one per handle of its mailbox "
        f"(--sessions-per-client {len(connection.names)}); detach one, attach it from "
        "another client, or start the daemon with a larger --sessions-per-client"
    )


def _log_answers(connection: Connection, answers: list[OutboxItem]) -> None:
    """Sessions coming and going, and refusals, for the log."""
    for answer in answers:
        if isinstance(answer, Notice) and answer.kind in _LOGGED:
            level = logging.INFO if answer.kind in _COMINGS else logging.WARNING
            text = f": {answer.message}" if answer.message else ""
            what = f"{answer.kind.name.lower()} {answer.session!r}{text}"
            log.log(level, "client %d: %s", connection.index, what)
