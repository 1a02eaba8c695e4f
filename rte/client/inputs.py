"""Big inputs, the client's side: arrays lent to the engine through slab slots.

An array in a request's conditioning (a camera frame, an image) goes one of
three ways:

- written into a slot the client loaned first (``client.loan(shape, dtype)``):
  published and sent as an :class:`~rte.ipc.values.InputRef`, never copied;
- any other array of :data:`BY_SLOT_BYTES` or more: copied once into a fresh
  slot, then the same (still no copy through the ring, none in the daemon);
- a smaller one: inline in the record, as before.

Slots are the client's own (owner = its client slot), under the input slab's
quota, exactly as output slots: a client out of quota waits (bounded) for the
daemon to hand slots back, then gets RequestTimeout. A slot belongs to the
daemon once its reference is sent; a send that failed takes its slots back.
In process there is no slab: a loan is a plain array, and arrays go by
reference anyway.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rte.errors import RequestTimeout, WireError
from rte.ipc.control import KIND_INPUTS
from rte.ipc.inputs import R, conditioning_of, with_conditioning
from rte.ipc.names import DaemonNames
from rte.ipc.values import InputRef
from rte.serve import Request
from shm import QuotaExceeded, Segment, SegmentNotFoundError, ShmError, Slab, SlabFull, SlotRef
from shm.segment import HEADER_SIZE
from shm.slab import Loan

BY_SLOT_BYTES = 64 * 1024  # arrays this big or bigger travel by slot, not in the record


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


def open_inputs(names: DaemonNames, own: Callable[[Segment], object]) -> Slab | None:
    """The daemon's input slab, mapped for this client to write its own slots in
    (None: the daemon has none); ``own`` keeps the segment to close it."""
    try:
        segment = Segment.open(names.inputs, kind=KIND_INPUTS)
    except SegmentNotFoundError:
        return None
    own(segment)
    return Slab(segment, HEADER_SIZE)


class Lender:
    """A shm client's loans in the daemon's input slab (``slab`` None: it has none)."""

    def __init__(self, slab: Slab | None, owner: int, name: str) -> None:
        self.slab = slab
        self.owner = owner
        self.name = name
        self._open: dict[int, Loan] = {}  # by the address of its array: loaned, not sent

    def loan(self, shape: tuple[int, ...], dtype: Any, timeout: float) -> InputLoan:
        """A writable slot for an input of ``shape`` and ``dtype``, waiting up to
        ``timeout`` s for quota; RequestTimeout when none came, WireError when
        the daemon has no input slab or its slots are too small."""
        slab = self._need(_nbytes(shape, dtype))
        loan = self._take(slab, tuple(shape), dtype, timeout)
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


def _nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    return math.prod(shape) * int(np.dtype(dtype).itemsize)


def _address(array: np.ndarray[Any, Any]) -> int:
    return int(array.ctypes.data)
