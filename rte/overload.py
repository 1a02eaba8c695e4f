"""Graceful overload: when the turn runs long, the lowest priority class slows first.

Every session has a priority class, 0 (highest) to :data:`LOWEST` (3); the
default is :data:`DEFAULT_PRIORITY` (1), so that a caller can rank one above
the crowd (0) or below it (2, 3) without touching the rest. A class runs at a
*divisor* ``k``: its sessions step every ``k``-th tick, ``k`` in 1, 2, 4.

Watches each paced turn (:class:`Governor`). A turn is *over* when it took more
than the period (it missed its next tick: a prediction is only the safe side of
the truth, so it never reduces a cohort whose turns fit); after
:data:`OVER_TURNS` over turns in a row the lowest class present that is not
yet at 4 has its divisor doubled (1 -> 2 -> 4), and only when every lower
class is at 4 is a higher one touched: no session ever gets less than a
quarter of its rate. After a change it waits a few rotations before it judges
again. Undoing is stepwise too, highest reduced class first, once
:data:`UNDER_TURNS` turns in a row have fit in ``RESTORE_SHARE`` of the budget
and the predicted turn with the restored rows fits it (hysteresis: it does not
undo what it would redo at once).

Rotation: a session of a class at divisor ``k`` steps in the ticks where
``(tick + slot) % k == 0``, its ``slot`` handed out in turn as sessions of
the class arrive, so each tick a different ``1/k`` of the class steps and none
starves. :meth:`Governor.pick` filters a host's due list (after credits and
quotas) at no cost while nothing is reduced. Each change tells the class's
sessions (REDUCED / RESTORED notices with the rate in their message).
"""

from __future__ import annotations

from collections.abc import Callable

from rte.contract import Notice, NoticeKind

LOWEST = 3
DEFAULT_PRIORITY = 1
MAX_DIVISOR = 4
OVER_TURNS = 3  # over turns in a row before a class is reduced
UNDER_TURNS = 30  # turns in a row well within the budget before one is restored
RESTORE_SHARE = 0.8  # "well within": under this share of the budget
_ORDINAL = {2: "2nd", 4: "4th"}


def check_priority(priority: int) -> int:
    """``priority`` if it is a class (0 to LOWEST); ValueError that says so if not."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= LOWEST:
        raise ValueError(
            f"priority must be a whole number 0 (highest) to {LOWEST}, not {priority!r}"
        )
    return priority


class Governor:
    """The divisors of the priority classes of one paced host.

    Args:
        pace_hz: the host's pace (the rates in the notices).
        budget_s: what one turn may take.
        predict: the predicted seconds of a turn of ``n`` rows, or None while unknown.
    """

    def __init__(
        self, pace_hz: float, budget_s: float, predict: Callable[[int], float | None]
    ) -> None:
        self.pace_hz = pace_hz
        self.budget_s = budget_s
        self.predict = predict
        self.divisor = [1] * (LOWEST + 1)
        self.priority: dict[str, int] = {}  # attached session -> class
        self.slot: dict[str, int] = {}
        self._arrivals = [0] * (LOWEST + 1)
        self._tick = 0
        self._over = self._under = 0
        self._hold = 0  # turns to wait after a change before judging again
        self._reduced = False

    def add(self, session: str, priority: int) -> list[Notice]:
        """A session arrives (or is attached again: its class is kept)."""
        if session in self.priority:
            return []
        self.priority[session] = priority
        self.slot[session] = self._arrivals[priority]
        self._arrivals[priority] += 1
        k = self.divisor[priority]
        return [self._notice(session, k, NoticeKind.REDUCED)] if k > 1 else []

    def remove(self, session: str) -> None:
        self.priority.pop(session, None)
        self.slot.pop(session, None)

    def reduced(self) -> int:
        """Sessions stepped at a reduced rate now."""
        if not self._reduced:
            return 0
        divisor = self.divisor
        return sum(1 for p in self.priority.values() if divisor[p] > 1)

    def pick(self, due: list[str]) -> list[str]:
        """Of ``due``, those whose class steps this tick (all while nothing is reduced)."""
        self._tick += 1
        if not self._reduced:
            return due
        tick, divisor, priority, slot = self._tick, self.divisor, self.priority, self.slot
        out = []
        for s in due:
            k = divisor[priority.get(s, DEFAULT_PRIORITY)]
            if k == 1 or (tick + slot.get(s, 0)) % k == 0:
                out.append(s)
        return out

    def observe(self, turn_s: float, stepped: int) -> list[Notice]:
        """One paced turn took ``turn_s`` seconds and stepped ``stepped`` rows (after
        the filter); returns the notices of a change of rates, if one is made.

        Only a turn that ran past its period is over: a prediction is the safe side
        of the truth, and judging by it reduced sessions whose turns fitted (and,
        counting the rows due before the filter, went on reducing them after the
        reduction had made the turn short)."""
        if self._hold > 0:
            self._hold -= 1
            return []
        self._over = self._over + 1 if turn_s > 1.0 / self.pace_hz else 0
        self._under = self._under + 1 if turn_s < RESTORE_SHARE * self.budget_s else 0
        if self._over >= OVER_TURNS:
            return self._reduce()
        if self._under >= UNDER_TURNS and self._reduced:
            return self._restore(stepped)
        return []

    def _present(self) -> list[int]:
        return sorted(set(self.priority.values()))

    def _reduce(self) -> list[Notice]:
        self._over = 0
        for cls in reversed(self._present()):  # the lowest class first
            if self.divisor[cls] < MAX_DIVISOR:
                return self._set(cls, self.divisor[cls] * 2, NoticeKind.REDUCED)
        return []  # every class at a quarter: nothing more to take

    def _restore(self, stepped: int) -> list[Notice]:
        self._under = 0
        for cls in self._present():  # the highest reduced class first
            k = self.divisor[cls]
            if k == 1:
                continue
            members = sum(1 for p in self.priority.values() if p == cls)
            more = members / (k // 2) - members / k  # rows per tick the restore adds
            predicted = self.predict(round(stepped + more))
            if predicted is not None and predicted > self.budget_s:
                return []  # it would be over again at once
            return self._set(cls, k // 2, NoticeKind.RESTORED)
        return []

    def _set(self, cls: int, k: int, kind: NoticeKind) -> list[Notice]:
        self.divisor[cls] = k
        self._reduced = any(d > 1 for d in self.divisor)
        self._hold = 2 * MAX_DIVISOR  # two rotations before judging the change
        return [self._notice(s, k, kind) for s, p in self.priority.items() if p == cls]

    def _notice(self, session: str, k: int, kind: NoticeKind) -> Notice:
        hz = self.pace_hz / k
        if k == 1:
            text = f"rate restored: stepped every tick ({hz:g} Hz)"
        else:
            text = (
                f"rate reduced by overload: stepped every {_ORDINAL[k]} tick ({hz:g} Hz of "
                f"{self.pace_hz:g}); higher priority classes keep theirs"
            )
        return Notice(session, kind, text)
