"""How a ring's consumer waits: the policies, the sleep handshake, many rings on one bell.

A ring (:mod:`shm.ring`) moves records; this is the waiting around it. Waiting
is a policy (:class:`WaitPolicy`): ``spin`` polls and yields, ``block`` sleeps
on the ring's :class:`~shm.doorbell.Doorbell` at once, and ``spin-then-block``
(the default) polls for ``spin_us`` microseconds first. Spinning is bounded:
it polls in C (the GIL released) in slices of :data:`SPIN_SLICE_NS` and yields
the core between slices.

Sleeping is a handshake with the producer, so no wake-up is lost: the consumer
announces its sleep in the ring's header (``shm_ring_prepare_sleep``), checks
once more, and only then sleeps on the doorbell; a producer that sees the
announcement after its push rings the bell (the C pairs the two). A consumer of
many rings (:func:`wait_any`) announces on each, then sleeps on one bell.

Every wait can be counted (:class:`WaitTally`: waits that found nothing at
once, sleeps on the bell, sleeps ended by a post), since a post that wakes a
sleeping process is the dearest thing here (~145 µs on a small VM, against
~1 µs for a Python call). A producer already posts only to an announced
sleeper (the handshake); a consumer sleeps less when it spins for as long as
its records usually take to come (:class:`AdaptiveSpin`: bounded, and the spin
yields the core every :data:`SPIN_YIELD_EVERY_NS`, for a peer on the same core
may be what it waits for; not at every poll, since on a busy box a yield can
cost a time slice behind the other runnable tasks).

Blocking waits accept ``check``, called about every :data:`CHECK_EVERY_S`
while waiting, so a caller can notice a dead peer and raise instead of waiting
out the timeout. Without ``check`` a blocked consumer sleeps on its doorbell
for the whole timeout: only a push wakes it (the lost-wake-up test relies on
that).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from shm.doorbell import Bell, Doorbell
from shm.native import lib

CHECK_EVERY_S = 0.1
SPIN_SLICE_NS = 1_000_000  # the spin policy polls in slices this long, yielding between
ADAPTIVE_SPIN_MAX_NS = 500_000  # an adaptive spin never spins longer than this
# a spin yields the core this often: not at every poll, for on a busy box a yield
# can cost a whole time slice (ms) behind the other runnable tasks
SPIN_YIELD_EVERY_NS = 100_000


class WaitPolicy(enum.Enum):
    SPIN = "spin"
    SPIN_THEN_BLOCK = "spin-then-block"
    BLOCK = "block"


@dataclasses.dataclass
class WaitTally:
    """How a consumer waited (process-local; its owner publishes it where inspectors
    read): ``waits`` that found nothing ready at once, ``sleeps`` on the doorbell,
    and ``wakeups``, the sleeps a post ended (each cost the producer a post and
    this side a wake-up)."""

    waits: int = 0
    sleeps: int = 0
    wakeups: int = 0

    def taken(self) -> WaitTally:
        """The counts so far, and zero here (for a publisher that adds deltas)."""
        counts = dataclasses.replace(self)
        self.waits = self.sleeps = self.wakeups = 0
        return counts


class AdaptiveSpin:
    """How long to spin before sleeping, from how long recent waits lasted.

    A wait that ends within the spin costs no post and no wake-up; a spin that
    outlasts it is only CPU. So the budget is twice the recent typical wait
    (a moving average of the waits that ended by a record, each as long as
    its record took to be pushed: :func:`wait_used` reads the ring's stamp,
    so the wake-up of a wait that slept is not learned as waiting), at least
    ``floor_ns`` and at most ``max_ns``; when recent waits are longer than
    ``max_ns`` the spin would not catch them, and the budget falls to
    ``floor_ns``. A timed-out wait counts as a long one (an idle peer).
    """

    def __init__(self, floor_ns: int, max_ns: int = ADAPTIVE_SPIN_MAX_NS) -> None:
        self.floor_ns = max(0, floor_ns)
        self.max_ns = max(self.floor_ns, max_ns)
        self.typical_ns = float(self.max_ns + 1)  # until shown otherwise: not worth a spin

    def budget_ns(self) -> int:
        """The spin for the next wait."""
        if self.typical_ns > self.max_ns:
            return self.floor_ns
        return int(min(self.max_ns, max(self.floor_ns, 2 * self.typical_ns)))

    def observe(self, waited_ns: int, ended: bool) -> None:
        """A wait lasted ``waited_ns``; ``ended``: by a record (False: it timed out)."""
        sample = waited_ns if ended else max(waited_ns, 4 * self.max_ns)
        self.typical_ns += (sample - self.typical_ns) / 4


class Waitable(Protocol):
    """What waiting needs of a ring: its C handle (a :class:`~shm.ring.Ring`'s)."""

    @property
    def handle(self) -> Any: ...


def pop_spin_ns(policy: WaitPolicy, spin_ns: int) -> int:
    """What a pop spins in C before anything slower, by ``policy``."""
    if policy is WaitPolicy.BLOCK:
        return 0
    return SPIN_SLICE_NS if policy is WaitPolicy.SPIN else spin_ns


def wait_used(
    ring: Waitable,
    doorbell: Bell | None,
    timeout: float,
    check: Callable[[], None] | None,
    policy: WaitPolicy,
    spin_ns: int,
    tally: WaitTally | None = None,
    adaptive: AdaptiveSpin | None = None,
) -> bool:
    """Wait by ``policy`` until ``ring`` holds a record; False after ``timeout`` s.
    ``spin_ns``: how long ``spin-then-block`` spins first, or ``adaptive``'s budget
    when given (which then learns from the wait); ``tally``: counted there."""
    handle = ring.handle
    if lib.shm_ring_used(handle):
        return True
    if tally is not None:
        tally.waits += 1
    learn = adaptive is not None and policy is WaitPolicy.SPIN_THEN_BLOCK
    start = time.monotonic_ns()
    if learn:
        assert adaptive is not None
        spin_ns = adaptive.budget_ns()
    found = _wait_used(ring, doorbell, timeout, check, policy, spin_ns, tally, start)
    if learn:
        assert adaptive is not None
        adaptive.observe(_came(handle, start, found), found)
    return found


def _came(handle: Any, start: int, found: bool) -> int:
    """How long after ``start`` a wait's record came: when the ring stamped its
    push, not when the waiter woke. A wait that slept lasts a wake-up longer
    (~145 us on a small VM), and learning that made the spin too short for the
    next record, that wait sleep too, and so on: a flat-out pair ping-ponged on
    posts. (The newest push: a later record than the waiter's own only makes the
    wait look longer.)"""
    end = time.monotonic_ns()
    came = lib.shm_ring_last_push_ns(handle) if found else 0
    return (min(end, max(start, came)) if came else end) - start


def _wait_used(
    ring: Waitable,
    doorbell: Bell | None,
    timeout: float,
    check: Callable[[], None] | None,
    policy: WaitPolicy,
    spin_ns: int,
    tally: WaitTally | None,
    start: int,
) -> bool:
    handle = ring.handle
    deadline = start + int(timeout * 1e9)
    spin_until = start + (spin_ns if policy is WaitPolicy.SPIN_THEN_BLOCK else 0)
    spinning = policy is WaitPolicy.SPIN
    next_check = start + int(CHECK_EVERY_S * 1e9)
    now = start
    while True:
        if spinning or now < spin_until:
            limit = deadline if spinning else spin_until
            slice_ns = SPIN_SLICE_NS if spinning else SPIN_YIELD_EVERY_NS
            if lib.shm_ring_wait_used(handle, max(0, min(limit - now, slice_ns))):
                return True
            os.sched_yield()  # between slices, let a peer on this core run
        elif sleep_on(
            ring, doorbell, (min(deadline, next_check) if check else deadline) - now, tally
        ):
            return True
        now = time.monotonic_ns()
        if check is not None and now >= next_check:
            check()
            next_check = now + int(CHECK_EVERY_S * 1e9)
        if now >= deadline:
            return bool(lib.shm_ring_used(handle))


def sleep_on(
    ring: Waitable, doorbell: Bell | None, budget_ns: int, tally: WaitTally | None = None
) -> bool:
    """Announce sleep, re-check, sleep on the doorbell for up to ``budget_ns``.
    True when records are there. (The handle is asked for at each step: a ring
    whose segment was closed meanwhile refuses, never reaches unmapped memory.)"""
    assert doorbell is not None  # a policy that sleeps needs one (Ring checks at open)
    if lib.shm_ring_prepare_sleep(ring.handle):
        return True
    try:
        rung = doorbell.wait(max(budget_ns, 0) / 1e9)
        if tally is not None:
            tally.sleeps += 1
            tally.wakeups += rung
    finally:
        lib.shm_ring_end_sleep(ring.handle)
    return bool(lib.shm_ring_used(ring.handle))


def wait_any(
    rings: Sequence[Waitable],
    doorbell: Doorbell,
    timeout: float,
    ready: Callable[[], bool] | None = None,
    *,
    policy: WaitPolicy = WaitPolicy.BLOCK,
    spin_us: float = 50.0,
    before_sleep: Callable[[], None] | None = None,
    tally: WaitTally | None = None,
) -> bool:
    """Wait by ``policy`` until any of ``rings`` holds a record, or ``timeout`` s pass.

    ``spin`` polls the rings (and ``ready``) for a slice and yields (the caller
    comes back); ``spin-then-block`` polls for ``spin_us`` first, then sleeps
    like ``block``. Every ring's producer must ring this ``doorbell``. ``ready``
    is any other condition to wake for; it is checked after the sleep is
    announced, and its producers must ring the doorbell (or call
    :meth:`Ring.wake <shm.ring.Ring.wake>`) after making it true.
    ``before_sleep`` runs once the spin is over and the sleep is certain but for
    that last check (announce the sleep to ``ready``'s producers there: they post
    only to a sleeper, and a post costs a system call). The spin yields the core
    every :data:`SPIN_YIELD_EVERY_NS` (its peer may need it). ``tally``: the wait counted there.
    True when woken or already ready; False on timeout.
    """

    def found() -> bool:
        return any(lib.shm_ring_used(ring.handle) for ring in rings) or (
            ready is not None and ready()
        )

    if found():
        return True
    if tally is not None:
        tally.waits += 1
    if policy is not WaitPolicy.BLOCK:
        spin_ns = SPIN_SLICE_NS if policy is WaitPolicy.SPIN else int(spin_us * 1000)
        now = time.monotonic_ns()
        end, next_yield = now + min(spin_ns, int(timeout * 1e9)), now + SPIN_YIELD_EVERY_NS
        while now < end:
            if found():
                return True
            now = time.monotonic_ns()
            if now >= next_yield:  # let a peer on this core run (it may be what we wait for)
                os.sched_yield()
                next_yield = now + SPIN_YIELD_EVERY_NS
        if policy is WaitPolicy.SPIN:
            return False
    prepared: list[Waitable] = []
    try:
        for ring in rings:
            if lib.shm_ring_prepare_sleep(ring.handle):
                return True
            prepared.append(ring)
        if before_sleep is not None:
            before_sleep()
        if ready is not None and ready():
            return True
        rung = doorbell.wait(timeout)
        if tally is not None:
            tally.sleeps += 1
            tally.wakeups += rung
        return rung
    finally:
        for ring in prepared:
            lib.shm_ring_end_sleep(ring.handle)
