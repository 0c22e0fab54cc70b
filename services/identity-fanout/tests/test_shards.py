"""The pure decisions of the sharded fan-out: how many shards, which ranges, the roll-up."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from identity_fanout.fanout.shards import (
    START,
    ShardState,
    roll_up,
    shard_count_for,
    shard_ranges,
    split_step,
)

U = [uuid.UUID(int=n) for n in range(10)]


def state(no: int, status: str, lower: uuid.UUID, cursor: uuid.UUID | None, n: int) -> ShardState:
    return ShardState(
        shard_no=no, status=status, lower_bound=lower, cursor=cursor, processed_count=n
    )


def test_roles_up_to_the_shard_size_stay_one_unit() -> None:
    assert [shard_count_for(n, 100) for n in (0, 1, 100)] == [0, 0, 0]
    assert [shard_count_for(n, 100) for n in (101, 200, 201, 300)] == [2, 2, 3, 3]
    with pytest.raises(ValueError, match="positive"):
        shard_count_for(10, 0)


def test_the_step_spreads_users_evenly_and_leaves_the_rest_to_the_last_shard() -> None:
    assert [split_step(300, 3), split_step(301, 3), split_step(2, 3)] == [100, 101, 1]
    with pytest.raises(ValueError, match="positive"):
        split_step(10, 0)


def test_ranges_are_contiguous_from_the_start_and_open_at_the_end() -> None:
    assert shard_ranges([U[3], U[6]]) == [(START, U[3]), (U[3], U[6]), (U[6], None)]
    assert shard_ranges([]) == [(START, None)]


def test_repeated_or_descending_bounds_never_make_empty_or_overlapping_ranges() -> None:
    assert shard_ranges([U[3], U[3], U[2], U[5]]) == [(START, U[3]), (U[3], U[5]), (U[5], None)]


@given(st.lists(st.integers(min_value=0, max_value=2**128 - 1), max_size=30))
def test_every_user_id_falls_in_exactly_one_range(ints: list[int]) -> None:
    ranges = shard_ranges([uuid.UUID(int=i) for i in ints])
    probes = [uuid.UUID(int=i) for i in ints] + [uuid.UUID(int=(i + 1) % 2**128) for i in ints]
    for probe in probes:
        if probe == START:
            continue  # below every real UserId
        hits = [r for r in ranges if r[0] < probe and (r[1] is None or probe <= r[1])]
        assert len(hits) == 1


def test_rollup_sums_and_keeps_the_low_watermark() -> None:
    shards = [
        state(2, "InProgress", U[3], U[4], 1),
        state(1, "Completed", START, U[3], 3),
        state(3, "Pending", U[6], None, 0),
    ]
    rollup = roll_up("InProgress", shards)
    assert (rollup.status, rollup.processed_count, rollup.cursor, rollup.completed_now) == (
        "InProgress",
        4,
        U[4],
        False,
    )


def test_rollup_cursor_is_the_lower_bound_of_an_unstarted_first_unfinished_shard() -> None:
    shards = [state(1, "Completed", START, U[3], 3), state(2, "Pending", U[3], None, 0)]
    assert roll_up("InProgress", shards).cursor == U[3]
    assert roll_up("InProgress", [state(1, "InProgress", START, None, 0)]).cursor is None


def test_the_last_shard_completes_the_task_once() -> None:
    shards = [state(1, "Completed", START, U[3], 3), state(2, "Completed", U[3], U[8], 5)]
    done = roll_up("InProgress", shards)
    assert (done.status, done.processed_count, done.cursor, done.completed_now) == (
        "Completed",
        8,
        U[8],
        True,
    )
    # A later roll-up (a repeat, or another shard's) does not complete it again.
    assert roll_up("Completed", shards).completed_now is False


def test_a_failed_task_is_not_completed_by_its_other_shards() -> None:
    shards = [state(1, "Completed", START, U[3], 3), state(2, "Failed", U[3], U[4], 1)]
    assert roll_up("Failed", shards).status == "Failed"
    all_done = [state(1, "Completed", START, U[3], 3), state(2, "Completed", U[3], U[5], 2)]
    assert roll_up("Failed", all_done).completed_now is False


def test_rollup_shows_the_shard_closest_to_poison_and_the_latest_live_lease() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    shards = [
        ShardState(
            shard_no=1,
            status="Completed",
            lower_bound=START,
            cursor=U[3],
            processed_count=3,
            attempt_count=4,
        ),
        ShardState(
            shard_no=2,
            status="InProgress",
            lower_bound=U[3],
            cursor=None,
            processed_count=0,
            attempt_count=2,
            lease_expires_at=now,
        ),
        ShardState(
            shard_no=3,
            status="InProgress",
            lower_bound=U[6],
            cursor=U[7],
            processed_count=1,
            attempt_count=1,
            lease_expires_at=now + timedelta(1),
        ),
        ShardState(
            shard_no=4,
            status="Pending",
            lower_bound=U[8],
            cursor=None,
            processed_count=0,
            attempt_count=1,
            lease_expires_at=now + timedelta(9),
        ),
    ]
    rollup = roll_up("InProgress", shards)
    assert (rollup.attempt_count, rollup.lease_expires_at) == (4, now + timedelta(1))
    done = [
        s
        if s.status == "Completed"
        else ShardState(
            shard_no=s.shard_no,
            status="Completed",
            lower_bound=s.lower_bound,
            cursor=U[9],
            processed_count=1,
            attempt_count=s.attempt_count,
        )
        for s in shards
    ]
    finished = roll_up("InProgress", done)
    assert (finished.completed_now, finished.lease_expires_at) == (True, None)
    assert roll_up("InProgress", []).attempt_count == 0
