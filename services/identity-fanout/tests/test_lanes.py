"""Lanes of the outbox without a database: a key's slot, lane groups, the balancing plan."""

from __future__ import annotations

import pytest

from identity_fanout.outbox.rules import (
    SLOTS,
    ForeignHolder,
    LaneLock,
    LanePlan,
    foreign_holders,
    lane_of_slot,
    plan_lanes,
    relay_instances,
    share,
    slots_of,
)


@pytest.mark.parametrize("lanes", [1, 3, 8, 64])
def test_the_lanes_partition_the_slots(lanes: int) -> None:
    groups = [slots_of([lane], lanes) for lane in range(lanes)]
    assert sorted(s for group in groups for s in group) == list(range(SLOTS))
    for lane, group in enumerate(groups):
        assert all(lane_of_slot(s, lanes) == lane for s in group)


def test_a_key_stays_in_one_lane_whatever_the_lane_count_is() -> None:
    # The lane is a function of the stored slot: a key never has rows in two lanes at once.
    for slot in range(SLOTS):
        for lanes in range(1, SLOTS + 1):
            assert slot in slots_of([lane_of_slot(slot, lanes)], lanes)


@pytest.mark.parametrize(
    ("lanes", "instances", "expected"), [(8, 1, 8), (8, 2, 4), (8, 3, 3), (8, 9, 1), (1, 2, 1)]
)
def test_share_covers_every_lane(lanes: int, instances: int, expected: int) -> None:
    assert share(lanes, instances) == expected
    assert share(lanes, instances) * instances >= lanes


def test_a_lone_instance_takes_every_free_lane() -> None:
    assert plan_lanes(8, 1, set(), set()) == LanePlan(acquire=tuple(range(8)))


def test_a_newcomer_makes_the_holder_hand_over_its_surplus_highest_first() -> None:
    assert plan_lanes(8, 2, set(range(8)), set()) == LanePlan(release=(4, 5, 6, 7))
    # The newcomer finds nothing free until then, and waits.
    assert plan_lanes(8, 2, set(), set(range(8))) == LanePlan()
    assert plan_lanes(8, 2, set(), {0, 1, 2, 3}) == LanePlan(acquire=(4, 5, 6, 7))


def test_a_dead_instances_lanes_are_taken_by_the_survivors() -> None:
    # Three instances held 3 + 3 + 2; one died (its locks went with its connection).
    assert plan_lanes(8, 2, {0, 1, 2}, {3, 4, 5}) == LanePlan(acquire=(6,))
    assert plan_lanes(8, 2, {3, 4, 5}, {0, 1, 2, 6}) == LanePlan(acquire=(7,))


def test_at_its_share_an_instance_stays_put() -> None:
    assert plan_lanes(8, 3, {0, 1, 2}, {3, 4, 5, 6, 7}) == LanePlan()
    assert plan_lanes(8, 3, {6, 7}, {0, 1, 2, 3, 4, 5}) == LanePlan()


def test_more_instances_than_lanes_leaves_the_surplus_idle() -> None:
    assert plan_lanes(2, 3, {0, 1}, set()) == LanePlan(release=(1,))
    assert plan_lanes(2, 3, set(), {0, 1}) == LanePlan()


def lock(member: bool, key: int, pid: int, *, relay: bool, user: str = "relay_login") -> LaneLock:
    return LaneLock(member, key, pid, "app", None, user, relay)


def test_only_relay_logins_are_instances_and_the_others_are_reported_by_session() -> None:
    locks = [
        lock(True, 0, 10, relay=True),
        lock(False, 3, 10, relay=True),
        # A foreign login's member locks from 7 sessions would have made 8 instances (the
        # real relay's share: 1 lane of 8); its slot locks keep those slots unpublished.
        *(lock(True, 0, pid, relay=False, user="rewards") for pid in range(20, 27)),
        lock(False, 9, 20, relay=False, user="rewards"),
        lock(False, 1, 20, relay=False, user="rewards"),
    ]
    assert relay_instances(locks) == 1
    holders = foreign_holders(locks)
    assert [h.pid for h in holders] == list(range(20, 27))
    assert holders[0] == ForeignHolder(
        pid=20, user_name="rewards", application_name="app", slots=(1, 9), member=True
    )
    assert all(h.slots == () and h.member for h in holders[1:])
    assert foreign_holders(locks[:2]) == []
