"""Big inputs, the client's side: arrays lent to the engine through slab slots.

An array in a request's conditioning (a camera frame, an image) goes one of
three ways:

- written into a slot the client loaned first (``client.loan(shape, dtype)``):
  published and sent as an :class:`~rte.protocol.values.InputRef`, never copied;
- any other array of :data:`BY_SLOT_BYTES` or more: copied once into a fresh
  slot, then the same (still no copy through the ring, none in the daemon);
- a smaller one: inline in the record, as before.

The slots are in the client's own input segment (one per client slot, made by
the daemon, mapped by this client and the daemon alone: see
:mod:`rte.ipc.inputs`), so no bug here can reach another client's frames. A
client that holds all its slots waits (bounded) for the daemon to hand some
back, then gets RequestTimeout. A slot belongs to the daemon once its
reference is sent; a send that failed takes its slots back. In process there
is no slab: a loan is a plain array, and arrays go by reference anyway.

Every shape and dtype a loan is asked for is checked before anything is mapped
(:func:`loan_layout`): dims are ints of 0 or more (never a bool, never
negative), the array holds at least one byte and fits a slot, and its dtype is
one the wire carries (bool, ints, floats, complex). Anything else is a
RequestError that says what was asked and what would do.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rte.errors import RequestError, RequestTimeout, WireError
from rte.protocol.control import KIND_INPUTS
from rte.protocol.inputs import OWNER, R, conditioning_of, open_slab, with_conditioning
from rte.protocol.names import DaemonNames
from rte.protocol.requests import Export, Request
from rte.protocol.values import InputRef
from rte.state import SessionState
from shm import QuotaExceeded, Segment, SegmentNotFoundError, ShmError, Slab, SlabFull, SlotRef
from shm.slab import Loan

BY_SLOT_BYTES = 64 * 1024  # arrays this big or bigger travel by slot, not in the record
MAX_NDIM = 8  # as the wire carries arrays (rte.protocol.values)
_KINDS = "biufc"  # bool, ints, floats, complex: what the wire carries (never objects)


class InputLoan:
    """An input buffer: ``with client.loan(shape, dtype) as frame:`` gives
    :attr:`array` to fill in place, then ``client.act(session, {"frame": frame})``
    sends it by reference. Leaving the block unsent gives the slot back."""

    __slots__ = ("_abort", "array")

    def __init__(self, array: np.ndarray[Any, Any], abort: Callable[[], None] | None) -> None:
        self.array = array
        self._abort = abort

    def __enter__(self) -> np.ndarray[Any, Any]:
        return self.array

    def __exit__(self, *exc: object) -> None:
        self.abort()

    def abort(self) -> None:
        """Give the slot back unless it was sent (idempotent)."""
        abort, self._abort = self._abort, None
        if abort is not None:
            abort()


def by_reference(request: R) -> R:
    """``request`` as the wire would carry it in process: its large arrays as
    references (for checking it against the wire's limits without a copy)."""
    conditioning = conditioning_of(request)
    if not conditioning or not any(
        type(v) is np.ndarray and v.nbytes >= BY_SLOT_BYTES for v in conditioning.values()
    ):
        return request
    refs = {
        k: InputRef(0, 0, v.dtype.str, v.shape)
        for k, v in conditioning.items()
        if type(v) is np.ndarray and v.nbytes >= BY_SLOT_BYTES
    }
    return with_conditioning(request, {**conditioning, **refs})


def loan_layout(shape: Any, dtype: Any) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """The checked shape, dtype and byte size of a loan of ``shape`` x ``dtype``.

    Raises:
        RequestError: a dim that is not an int of 0 or more (a bool, a float, a
            negative one), more than 8 dims, a dtype the wire does not carry, or
            an array of no bytes (nothing to lend: send it inline).
    """
    asked = f"a loan of shape {shape!r} and dtype {dtype!r}"
    try:
        dims = [shape] if not isinstance(shape, tuple | list) else list(shape)
        if any(isinstance(d, bool | np.bool_) for d in dims):
            raise TypeError("a bool is not a dimension")
        checked = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise RequestError(f"{asked}: the shape must be a tuple of ints") from None
    if any(d < 0 for d in checked):
        raise RequestError(f"{asked}: a dimension is negative; each must be 0 or more")
    if len(checked) > MAX_NDIM:
        raise RequestError(f"{asked}: at most {MAX_NDIM} dimensions")
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise RequestError(f"{asked}: not a NumPy dtype ({exc})") from None
    if dt.kind not in _KINDS or dt.shape:
        raise RequestError(f"{asked}: inputs are bool, int, float or complex arrays, not {dt}")
    nbytes = math.prod(checked) * dt.itemsize  # (a Python int: it cannot overflow)
    if nbytes == 0:
        raise RequestError(f"{asked}: it holds no bytes; send an empty array inline instead")
    return checked, dt, nbytes


def open_inputs(names: DaemonNames, index: int, own: Callable[[Segment], object]) -> Slab | None:
    """Client slot ``index``'s own input segment, mapped for this client to write its
    slots in (None: the daemon takes no inputs by slot); ``own`` keeps it to close it.
    Only this one is opened: no other client's is ever mapped here."""
    try:
        segment = Segment.open(names.client_inputs(index), kind=KIND_INPUTS)
    except SegmentNotFoundError:
        return None
    own(segment)
    return open_slab(segment)


class Lender:
    """A shm client's loans in its own input segment (``slab`` None: the daemon has
    none); ``record_limit`` is the largest record its inbox ring carries."""

    def __init__(self, slab: Slab | None, name: str, record_limit: int) -> None:
        self.slab = slab
        self.owner = OWNER
        self.name = name
        self.record_limit = record_limit
        self._open: dict[int, Loan] = {}  # by the address of its array: loaned, not sent
        self._exports: dict[tuple[int, int], np.ndarray[Any, Any]] = {}  # (slot, generation)

    def loan(self, shape: Any, dtype: Any, timeout: float) -> InputLoan:
        """A writable slot for an input of ``shape`` and ``dtype``, waiting up to
        ``timeout`` s for quota; RequestTimeout when none came, RequestError for a
        shape or dtype that cannot be lent (:func:`loan_layout`), WireError when
        the daemon has no input slots or they are too small."""
        checked, dt, nbytes = loan_layout(shape, dtype)
        slab = self._need(nbytes)
        loan = self._take(slab, checked, dt, timeout)
        address = _address(loan.array)
        self._open[address] = loan

        def abort() -> None:
            if self._open.get(address) is loan:  # (not a later loan of the same slot)
                del self._open[address]
                loan.abort()

        return InputLoan(loan.array, abort)

    def lend(
        self, conditioning: Mapping[str, Any], timeout: float
    ) -> tuple[dict[str, Any], list[SlotRef]]:
        """``conditioning`` with its loaned and big arrays made InputRefs (their slots
        published), and the slots sent that way (for :meth:`take_back`). The copies
        are made first: a RequestTimeout for want of quota leaves every loan open."""
        chosen: dict[str, tuple[np.ndarray[Any, Any], Loan | None]] = {}
        for key, value in conditioning.items():
            if type(value) is not np.ndarray:
                continue
            loan = self._open.get(_address(value))
            if loan is not None and (value.shape, value.dtype) == (
                loan.array.shape,
                loan.array.dtype,
            ):
                chosen[key] = (value, loan)
            elif value.nbytes >= BY_SLOT_BYTES and self.slab is not None:
                chosen[key] = (value, None)  # (a view of a loan, not it, is copied too)
        if not chosen:
            self._check_inline(conditioning)
            return dict(conditioning), []
        copies: list[Loan] = []
        try:
            for key, (value, given) in chosen.items():
                if given is None:
                    copy = self._take(self._need(value.nbytes), value.shape, value.dtype, timeout)
                    copies.append(copy)
                    np.copyto(copy.array, value)
                    chosen[key] = (value, copy)
        except BaseException:
            for loan in copies:
                loan.abort()
            raise
        out = dict(conditioning)
        refs = []
        for key, (value, loan) in chosen.items():
            assert loan is not None
            self._open.pop(_address(loan.array), None)
            ref = loan.publish()
            refs.append(ref)
            out[key] = InputRef(ref.slot, ref.generation, value.dtype.str, value.shape)
        return out, refs

    def lend_request(self, request: R, timeout: float) -> R:
        """``request`` with its large arrays by reference (itself when it has none)."""
        conditioning = conditioning_of(request)
        if not conditioning:
            return request
        lent, refs = self.lend(conditioning, timeout)
        return with_conditioning(request, lent) if refs else request

    def export_into(self, request: Export, timeout: float) -> Export:
        """``request`` sent with a whole slot of this client's input segment for the
        daemon to write the state's bytes in (:meth:`exported` reads them)."""
        slab = self._need(1)
        size = slab.slot_size
        loan = self._take(slab, (size,), np.uint8, timeout)
        ref = loan.publish()
        self._exports[(ref.slot, ref.generation)] = loan.array
        into = InputRef(ref.slot, ref.generation, np.dtype(np.uint8).str, (size,))
        return dataclasses.replace(request, into=into)

    def exported(self, request: Export, nbytes: int) -> SessionState:
        """The state the daemon wrote into ``request``'s slot (``nbytes`` of it)."""
        into = request.into
        array = self._exports[(into.slot, into.generation)]
        return SessionState.from_bytes(array[:nbytes].tobytes())

    def export_done(self, request: Export) -> None:
        """``request``'s slot is this client's to free again (read, or refused)."""
        into = request.into
        if self._exports.pop((into.slot, into.generation), None) is not None:
            self.take_back([SlotRef(into.slot, into.generation, self.owner)])

    def unsent(self, request: Request) -> None:
        """A request :meth:`lend_request` made was not sent: its slots come back."""
        refs = [
            SlotRef(v.slot, v.generation, self.owner)
            for v in (conditioning_of(request) or {}).values()
            if type(v) is InputRef
        ]
        if refs:
            self.take_back(refs)

    def take_back(self, refs: list[SlotRef]) -> None:
        """Slots published for a request that was never sent: ours again, freed."""
        for ref in refs:
            try:
                assert self.slab is not None
                self.slab.release(ref)
            except ShmError:
                pass  # reclaimed meanwhile: nothing to give back

    def _check_inline(self, conditioning: Mapping[str, Any]) -> None:
        """Arrays going inline that no record can carry: say which option takes them."""
        inline = sum(v.nbytes for v in conditioning.values() if type(v) is np.ndarray)
        if self.slab is None and inline > self.record_limit:
            raise WireError(
                f"{inline:,} bytes of arrays exceed the largest record of daemon "
                f"{self.name!r}'s rings ({self.record_limit:,} bytes), and it takes no inputs "
                "by slot: start it with --input-slots N (large inputs then go by reference), "
                "or send smaller arrays"
            )

    def _need(self, nbytes: int) -> Slab:
        if self.slab is None:
            raise WireError(
                f"daemon {self.name!r} takes no inputs by slot: start it with --input-slots N"
            )
        if nbytes > self.slab.slot_size:
            kib = -(-nbytes // 1024)
            raise WireError(
                f"an input of {nbytes:,} bytes exceeds the input slots of daemon {self.name!r} "
                f"({self.slab.slot_size:,} bytes): start it with --input-slot-kib {kib}"
            )
        return self.slab

    def _take(self, slab: Slab, shape: tuple[int, ...], dtype: Any, timeout: float) -> Loan:
        deadline = time.monotonic() + timeout
        pause = 50e-6
        while True:
            try:
                return slab.loan(self.owner, dtype, shape)
            except (QuotaExceeded, SlabFull) as exc:
                if time.monotonic() + pause > deadline:
                    raise RequestTimeout(
                        f"no input slot of daemon {self.name!r} came free in {timeout}s: "
                        f"the client holds its quota of {slab.quota} (frames the engine still "
                        f"reads; each goes back a step after a later one replaces it) ({exc})"
                    ) from None
            time.sleep(pause)
            pause = min(2 * pause, 2e-3)


def _address(array: np.ndarray[Any, Any]) -> int:
    return int(array.ctypes.data)
