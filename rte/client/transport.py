"""Transport: what a client form supplies beneath the one client core.

After vLLM's ``EngineCoreClient`` with its ``InprocClient`` / ``MPClient``: the
behaviour lives once, in :class:`~rte.client.core.ClientCore` (numbering,
expected answers, sorting arrivals, the batch queue, held counts), and each
way of reaching an engine is a :class:`Transport` that moves requests and
arrivals without waiting for them: over a daemon's shared memory
(:class:`~rte.client.shm.ShmTransport`), to an engine on a thread of this
process (:class:`~rte.client.inprocess.InProcessTransport`), or over several
daemons at once (:class:`~rte.client.pool.PoolTransport`).

Waiting is the caller's: the sync client (:class:`~rte.client.base.EngineClient`)
blocks in :meth:`Transport.wait`; the asyncio client
(:class:`~rte.client.aio.AsyncClient`) announces a sleep with :meth:`Transport.arm`,
watches :meth:`Transport.wake_fds` with ``loop.add_reader`` and ends it with
:meth:`Transport.disarm`. So every transport plugs into both.

A transport hands its arrivals up as chunk batches (released through the
core's callback, which counts them and gives their rows back here), notices,
and :class:`Gone` markers for sessions it lost without a word from their
engine (a pool member that died).

**An export given up on** (its call waited in vain, or a move's: the daemon
stopped, paused or busy) is still on its way, and its engine carries it out
when it comes round: it lets the session go and writes its state where the
export said (a slot the client lent in its input segment, a box in process).
:class:`LateExports` keeps that slot lent until the answer comes (one freed
and lent again would take the state's bytes over another input, and the state
would be lost), then attaches the session again where it was, with that
state: what the timed-out caller was told ("it stays as it was") comes true,
its chunks go on from the next index, its frames the never-exported twin's.
A refusal frees the slot (it stayed as it was). A state no daemon takes is
never dropped: it waits in ``client.stranded`` and an ERROR notice names it.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rte.client.batch import ChunkBatch, Release
from rte.client.inputs import InputLoan
from rte.contract import Manifest, Notice, NoticeKind
from rte.errors import RequestError, RequestTimeout, RteError
from rte.overload import DEFAULT_PRIORITY
from rte.protocol.requests import Act, Attach, Export, Request, StateBox
from rte.state import SessionState

if TYPE_CHECKING:
    from rte.client.core import ClientCore


@dataclass(frozen=True)
class Gone:
    """Session ``session`` is no longer attached: its engine died (the notice
    that says so comes with it). Counted by the core, never handed out."""

    session: str


Arrival = ChunkBatch | Notice | Gone
Numbering = Callable[[], int]  # the core's next request number


class Transport(abc.ABC):
    """One way to reach an engine. Not thread-safe: one client uses it.

    Attributes:
        name: the engine's name (a daemon's, ``"in-process"``, a pool's).
        manifest: what the engine promises.
        closed: whether :meth:`close` ran (or the transport gave up for good).
    """

    name: str
    manifest: Manifest
    closed: bool = False

    def number_with(self, numbering: Numbering) -> None:  # noqa: B027 (most need no numbers)
        """Requests the transport makes itself (a pool's reattach) take their
        numbers from ``numbering``, the core's, so no answer is mistaken."""

    # -- requests out ---------------------------------------------------------

    @abc.abstractmethod
    def send(self, request: Request, room_s: float = 0.0) -> None:
        """Hand over one request; waits for room up to ``room_s`` (0: not at all;
        RequestTimeout when there is none). WireError (a RequestError) for one
        that cannot be sent; EngineGone when the engine cannot be reached."""

    @abc.abstractmethod
    def loan(self, shape: tuple[int, ...], dtype: Any, timeout: float) -> InputLoan:
        """A buffer for a large input (see :meth:`EngineClient.loan`)."""

    def lend(self, request: Request, timeout: float) -> Request:
        """``request`` with its large arrays sent by reference (its form's way)."""
        return request

    def unlend(self, request: Request) -> None:  # noqa: B027 (nothing was taken)
        """``request`` was not sent: what :meth:`lend` took for it goes back."""

    def export_into(self, request: Export, timeout: float) -> Export:
        """``request`` with where its state goes (here: a box the loop of this
        process fills with the state itself)."""
        return dataclasses.replace(request, into=StateBox())

    def exported(self, request: Export, nbytes: int) -> SessionState:
        """The state an EXPORTED answer to ``request`` handed over."""
        box = request.into
        if not isinstance(box, StateBox) or box.state is None:
            raise RequestError(f"export of {request.session!r}: no state was handed over")
        return box.state

    def export_done(self, request: Export) -> None:  # noqa: B027 (nothing was taken)
        """What :meth:`export_into` took for ``request`` goes back."""

    def home_of(self, session: str) -> str:
        """The daemon ``session`` lives on, of several ("": this transport's one engine)."""
        return ""

    def pin(self, session: str, first: str) -> None:  # noqa: B027 (one engine: nowhere else)
        """The next attach of ``session`` goes to daemon ``first`` (of several), and to
        the others only if it refuses (an export given up on, carried out late: its
        session attached again where it was, :class:`~rte.client.in_flight.LateExports`)."""

    def unpin(self, session: str) -> None:  # noqa: B027 (nothing was pinned)
        """:meth:`pin`'s attach was answered: ``session`` is placed as any other again."""

    # -- arrivals in ----------------------------------------------------------

    @abc.abstractmethod
    def receive(self, release: Release) -> list[Arrival]:
        """What arrived, at once ([] if nothing); each batch is released through
        ``release`` (the core's count, then :meth:`give_back`)."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` s until something may be received; True if so.
        EngineGone when the engine died meanwhile."""

    @abc.abstractmethod
    def give_back(self, batch: ChunkBatch, rows: np.ndarray[Any, Any]) -> None:
        """Rows of ``batch`` (indices into its lease) were released: their memory goes back."""

    # -- waiting on an event loop -------------------------------------------

    @abc.abstractmethod
    def wake_fds(self) -> list[int]:
        """The descriptors that turn readable when :meth:`arm` asked for a wake-up."""

    @abc.abstractmethod
    def arm(self) -> bool:
        """Announce a sleep on :meth:`wake_fds`; True when something arrived already
        (then no sleep was announced). After a sleep, call :meth:`disarm`."""

    @abc.abstractmethod
    def disarm(self) -> bool:
        """End a sleep: take the wake-ups; False when the engine's side is gone."""

    @abc.abstractmethod
    def check_live(self, alive: bool = True) -> None:
        """EngineGone when the engine stopped or died (``alive`` False: its side of
        the wake-up closed, so it did)."""

    # -- leaving --------------------------------------------------------------

    @abc.abstractmethod
    def close(self) -> None:
        """Leave the engine: every chunk and what the client holds go back (idempotent)."""


def send_lent(transport: Transport, request: Request, room_s: float) -> None:
    """Lend ``request``'s large arrays and send it, waiting up to ``room_s`` for room;
    one that could not be sent gives back what it was lent."""
    lent = transport.lend(request, room_s)
    try:
        transport.send(lent, room_s)
    except BaseException:
        transport.unlend(lent)
        raise


def send_held(core: ClientCore, transport: Transport, held: list[Act], room_s: float) -> None:
    """Send the actions held while their session was on its way, where it is now;
    one that cannot go is an ERROR notice of its seq."""
    for request in held:
        try:
            send_lent(transport, request, room_s)
        except RteError as why:
            text = f"action {request.seq} of {request.session!r} sent during its move: {why}"
            core.sort([Notice(request.session, NoticeKind.ERROR, text, request.seq)])


@dataclass
class Late:
    """An export given up on, on its way: the request whose slot stays lent, then
    the attach of its state where it was (see :class:`LateExports`)."""

    request: Export
    old: str  # the daemon it was on ("": the transport's one engine)
    error: RequestTimeout  # what its call raised
    state: SessionState | None = None  # carried out: its state, to attach again
    attach: Attach | None = None  # that attach, on its way
    held: list[Act] = field(default_factory=list)  # actions sent meanwhile


class LateExports:
    """One client's exports given up on (see the module). Nothing here waits: the
    client's pump calls :meth:`settle` after each receive.

    Args:
        core: the client's core (whose :attr:`~ClientCore.late` this becomes).
        transport: the client's transport.
        stranded: the client's ``stranded`` (session -> a state no daemon took).
    """

    def __init__(
        self, core: ClientCore, transport: Transport, stranded: dict[str, SessionState]
    ) -> None:
        self._core, self._transport, self.stranded = core, transport, stranded
        self.by_session: dict[str, Late] = {}  # (a plain dict: act's check is one lookup)
        core.late = self

    def __contains__(self, session: object) -> bool:
        return session in self.by_session

    def give_up(self, request: Export, old: str, timeout: float) -> Late:
        """``request`` was sent and its call waited ``timeout`` s in vain (its seq
        forgotten since): its slot stays lent, its answer is taken when it comes.
        ``old``: the daemon its session is on. :attr:`Late.error` says so."""
        session, where = request.session, repr(old or self._transport.name)
        error = RequestTimeout(
            f"{self._core.unanswered(request, timeout)}; the export may still be carried out "
            f"when {where} comes round: {session!r} is then attached again on {where} with its "
            "state, going on at its next chunk (a call on it waits for that first; should no "
            f"daemon take it, client.stranded[{session!r}] holds the state and an ERROR notice "
            "says so); refused, it stays as it was"
        )
        late = self.by_session[session] = Late(request, old, error)
        self._core.expect(request)  # (its answer is never news)
        return late

    def keeps(self, request: Export) -> bool:
        """Whether ``request``'s slot is kept here (not its caller's to free)."""
        late = self.by_session.get(request.session)
        return late is not None and late.request is request

    def hold(self, act: Act) -> bool:
        """Keep ``act`` until its session's late export ended (True), then send it
        where the session is: before, it could reach a daemon that let it go."""
        late = self.by_session.get(act.session)
        if late is not None:
            late.held.append(act)
        return late is not None

    def lost(self, session: str) -> None:
        """``session``'s engine died (a pool member): no answer will come; what was
        held for it is refused (its loss has its own notice)."""
        late = self.by_session.get(session)
        if late is None or late.state is not None:  # (its attach is the placer's to pass on)
            return
        del self.by_session[session]
        self._transport.export_done(late.request)
        self._transport.unpin(session)
        for act in late.held:
            text = f"action {act.seq} of {session!r}: not sent, its engine is gone"
            self._core.sort([Notice(session, NoticeKind.ERROR, text, act.seq)])

    def busy(self, session: str) -> RequestError:
        """Why a move of ``session`` cannot start now (it is tried again later)."""
        return RequestError(
            f"an export of {session!r} given up on earlier is still on its way; it stays "
            "where it is until that ends: try again then"
        )

    def settle(self) -> None:
        """Take the late answers that came: a state read from its slot (then freed)
        and attached again where it was, a refusal's slot freed; each attach's answer."""
        core = self._core
        for late in list(self.by_session.values()):
            if late.state is not None and late.attach is None:
                self._attach(late)  # (no ring had room before)
                continue
            request = late.request if late.attach is None else late.attach
            if not core.answered(request.seq):
                continue
            core.forget(request.seq)
            try:
                answer = core.answer(request.seq)
            except RteError as why:
                if late.attach is not None:
                    self._strand(late, why)
                    continue
                self._transport.export_done(late.request)  # refused: it stayed as it was
                self._end(late)
                continue
            if late.attach is None:
                self._exported(late, int(answer.message or 0))
            else:
                where = late.old or self._transport.name
                text = f"attached again on {where!r}, going on at its next chunk"
                self._end(late, Notice(late.request.session, NoticeKind.ATTACHED, text, answer.seq))

    def _exported(self, late: Late, nbytes: int) -> None:
        session, transport = late.request.session, self._transport
        try:
            late.state = transport.exported(late.request, nbytes)
        except RteError as why:  # (unreadable: nothing to attach)
            said = f"its state could not be read ({why}): it is attached nowhere"
            self._end(late, Notice(session, NoticeKind.ERROR, said))
            return
        finally:
            transport.export_done(late.request)
        self._core.sessions.add(session)  # as its caller believes (its attach goes next)
        self._attach(late)

    def _attach(self, late: Late) -> None:
        """Send the attach of ``late``'s state, pinned where it was."""
        assert late.state is not None
        core, transport, session = self._core, self._transport, late.request.session
        try:
            request = core.attach(session, None, 0, DEFAULT_PRIORITY, late.state)
            core.expect(request)
        except RteError as why:  # (closed meanwhile)
            return self._strand(late, why)
        transport.pin(session, late.old)
        try:
            send_lent(transport, request, 0.0)
        except RteError as why:
            core.forget(request.seq)
            if not isinstance(why, RequestTimeout):  # (no room: again at the next settle)
                self._strand(late, why)
            return None
        late.attach = request
        return None

    def _strand(self, late: Late, why: RteError) -> None:
        assert late.state is not None
        session = late.request.session
        self.stranded[session] = late.state
        self._core.sessions.discard(session)
        text = (
            f"attaching it again with its state failed ({why}): it is attached nowhere; its "
            f"state is client.stranded[{session!r}] (attach(s, state=client.stranded.pop(s)))"
        )
        for act in late.held:
            why_not = f"action {act.seq} of {session!r}: not sent, it is attached nowhere"
            self._core.sort([Notice(session, NoticeKind.ERROR, why_not, act.seq)])
        late.held = []
        self._end(late, Notice(session, NoticeKind.ERROR, text))

    def _end(self, late: Late, news: Notice | None = None) -> None:
        """``late`` ended (``news`` for the caller); its held actions go out."""
        session = late.request.session
        del self.by_session[session]
        self._transport.unpin(session)
        if news is not None:
            said = f"export of {session!r}, given up on, was carried out late: {news.message}"
            self._core.sort([Notice(session, news.kind, said, news.seq)])
        send_held(self._core, self._transport, late.held, 0.0)
