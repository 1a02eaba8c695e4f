"""Placement: the one sticky least-loaded policy (pure: no member is asked anything)."""

from __future__ import annotations

from rte.placement import Member, Placement, ranked


def test_most_free_rows_first_then_fewest_of_mine_then_as_given() -> None:
    members = [
        Member("a", free_rows=1),
        Member("b", free_rows=3, mine=2),
        Member("c", free_rows=3, mine=1),
        Member("d", free_rows=3, mine=1),
    ]
    assert ranked(members) == ["c", "d", "b", "a"]


def test_full_and_dead_members_are_no_candidates() -> None:
    members = [
        Member("full", free_rows=0),
        Member("dead", free_rows=5, live=False),
        Member("over", free_rows=-1),  # more held than rows (a manifest shrunk)
        Member("ok", free_rows=1),
    ]
    assert ranked(members) == ["ok"]
    assert ranked([Member("full", 0)]) == []


def test_pack_puts_the_fullest_member_with_room_first() -> None:
    members = [Member("idle", 4), Member("busy", 1), Member("full", 0), Member("half", 2)]
    assert ranked(members, pack=True) == ["busy", "half", "idle"]


def test_a_placed_session_is_sticky_whatever_its_members_room() -> None:
    placement: Placement[str] = Placement()
    assert placement.choices("s", {"a": 1, "b": 2}) == ["b", "a"]
    placement.settle("s", "a")
    assert placement.choices("s", {"a": 0, "b": 9}) == ["a"]
    assert placement["s"] == "a"
    assert dict(placement) == {"s": "a"}
    assert placement.release("s") == "a"
    assert placement.release("s") is None
    assert "s" not in placement


def test_the_callers_own_load_breaks_ties_between_equal_rooms() -> None:
    placement: Placement[int] = Placement()
    placement.settle("x1", 0, owner="x")
    placement.settle("y1", 1, owner="y")
    placement.settle("y2", 1, owner="y")
    assert placement.load(0, "x") == 1
    assert placement.load(1, "x") == 0
    assert placement.choices("x2", {0: 2, 1: 2}, owner="x") == [1, 0]
    assert placement.choices("y3", {0: 2, 1: 2}, owner="y") == [0, 1]
    assert placement.owner_of("y2") == "y"


def test_liveness_is_asked_of_each_member() -> None:
    placement: Placement[str] = Placement()
    dead = {"b"}
    assert placement.choices("s", {"a": 1, "b": 5}, live=lambda k: k not in dead) == ["a"]


def test_a_lost_member_gives_back_its_sessions_with_their_owners() -> None:
    placement: Placement[str] = Placement()
    placement.settle("s1", "a", owner="o1")
    placement.settle("s2", "b", owner="o1")
    placement.settle("s3", "a", owner="o2")
    assert placement.lose("a") == [("s1", "o1"), ("s3", "o2")]
    assert dict(placement) == {"s2": "b"}
    assert placement.lose("a") == []
    # lost sessions are placed anew, elsewhere
    assert placement.choices("s1", {"a": 3, "b": 1}, live=lambda k: k != "a") == ["b"]
