"""How far a fan-out has come, from its rows alone: total, done, percentage, rate, ETA."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from identity_fanout.fanout.queue import FanOutShard, FanOutTask
from identity_fanout.fanout.shards import START, shard_sizes
from identity_fanout.ops.cells import NULL, duration_cell, percent_cell, rate_cell
from identity_fanout.ops.progress import blocked_reason, task_progress

NOW = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)


TASK = FanOutTask(
    id=uuid.uuid4(),
    role_id=uuid.uuid4(),
    company_id=None,
    role_version=2,
    reason="RolePermissionsChanged",
    status="InProgress",
    cursor=None,
    processed_count=0,
    attempt_count=1,
    lease_expires_at=None,
    last_error=None,
    created_at=NOW - timedelta(minutes=5),
    started_at=NOW - timedelta(seconds=100),
    completed_at=None,
    updated_at=NOW,
)
SHARD = FanOutShard(
    id=uuid.uuid4(),
    task_id=TASK.id,
    shard_no=1,
    lower_bound=START,
    upper_bound=None,
    status="InProgress",
    cursor=None,
    processed_count=0,
    attempt_count=1,
    lease_expires_at=None,
    last_error=None,
    started_at=NOW - timedelta(seconds=10),
    completed_at=None,
    updated_at=NOW,
)


def task(**fields: Any) -> FanOutTask:
    return msgspec.structs.replace(TASK, **fields)


def shard(no: int, **fields: Any) -> FanOutShard:
    return msgspec.structs.replace(SHARD, shard_no=no, **fields)


def test_a_running_task_has_its_percentage_rate_over_its_life_and_eta() -> None:
    progress = task_progress(task(processed_count=2_000, user_count=10_000), [], NOW)
    assert (progress.total, progress.done, progress.percent) == (10_000, 2_000, 20.0)
    assert progress.rate_per_second == 20.0  # 2,000 users in the 100 s since StartedAt
    assert progress.eta_seconds == 400.0
    assert progress.rate_basis == "life"


def test_each_shard_has_its_own_and_a_task_without_its_count_takes_the_shards_sum() -> None:
    shards = [
        shard(1, processed_count=50, user_count=100),
        shard(2, processed_count=0, user_count=100, status="Pending", started_at=None),
    ]
    progress = task_progress(task(processed_count=50), shards, NOW)
    assert progress.total == 200
    assert [(s.shard_no, s.percent, s.rate_per_second) for s in progress.shards] == [
        (1, 50.0, 5.0),
        (2, 0.0, None),
    ]
    assert progress.shards[0].eta_seconds == 10.0
    assert progress.shards[1].eta_seconds is None  # no rate before its first claim


def test_unknown_totals_and_ends() -> None:
    pending = task_progress(task(status="Pending", started_at=None), [], NOW)
    assert (pending.total, pending.percent, pending.rate_per_second, pending.eta_seconds) == (
        None,
        None,
        None,
        None,
    )
    done = task_progress(
        task(status="Completed", processed_count=10, user_count=12, completed_at=NOW), [], NOW
    )
    assert (done.percent, done.eta_seconds) == (100.0, 0.0)
    failed = task_progress(task(status="Failed", processed_count=5, user_count=10), [], NOW)
    assert (failed.percent, failed.eta_seconds) == (50.0, None)  # waits for a replay
    # Users assigned after the count are reached too: never past 100 while it runs.
    grown = task_progress(task(processed_count=15, user_count=10), [], NOW)
    assert (grown.percent, grown.eta_seconds) == (100.0, 0.0)


@pytest.mark.parametrize(
    ("users", "step", "shards", "sizes"),
    [(90, 30, 3, [30, 30, 30]), (100, 34, 3, [34, 34, 32]), (7, 3, 3, [3, 3, 1]), (5, 5, 0, [])],
)
def test_shard_sizes_at_the_split(users: int, step: int, shards: int, sizes: list[int]) -> None:
    assert shard_sizes(users, step, shards) == sizes


def test_cells_show_a_missing_value_as_one_symbol() -> None:
    assert (duration_cell(None), percent_cell(None), rate_cell(None)) == (NULL, NULL, NULL)
    assert (duration_cell(4.25), duration_cell(42), duration_cell(185), duration_cell(7_620)) == (
        "4.2s",
        "42s",
        "3m05s",
        "2h07m",
    )


def blocked(unit: FanOutTask, shards: list[FanOutShard] | None = None, **facts: int) -> str | None:
    figures = {"live_workers": 1, "outbox_rows": 0, "max_outbox_backlog": 10_000} | facts
    return blocked_reason(unit, shards or [], NOW, **figures)


def test_a_task_that_cannot_move_has_no_eta_but_the_reason() -> None:
    running = task(
        processed_count=2_000, user_count=10_000, lease_expires_at=NOW + timedelta(minutes=1)
    )
    assert blocked(running) is None
    assert (blocked(running, live_workers=0) or "").startswith("no worker")
    assert (blocked(running, outbox_rows=10_000) or "").startswith("throttled: 10000 outbox")
    assert blocked(running, outbox_rows=9_999) is None
    lapsed = task(
        processed_count=2_000, user_count=10_000, lease_expires_at=NOW - timedelta(seconds=1)
    )
    assert (blocked(lapsed) or "").startswith("stalled: the lease")
    # A sharded task is stalled only when every shard in progress is.
    live, dead = NOW + timedelta(minutes=1), NOW - timedelta(minutes=1)
    shards = [shard(1, lease_expires_at=dead), shard(2, lease_expires_at=live)]
    assert blocked(task(), shards) is None
    assert (blocked(task(), [shards[0]]) or "").startswith("stalled")
    # An ended task moves no more and is not blocked.
    assert blocked(task(status="Completed"), live_workers=0) is None

    progress = task_progress(running, [shard(1)], NOW, blocked="no worker: none connected")
    assert (progress.eta_seconds, progress.blocked) == (None, "no worker: none connected")
    assert progress.rate_per_second == 20.0  # the figures stay: only the ETA is withheld
    assert progress.shards[0].eta_seconds is None
    done = task_progress(task(status="Completed"), [], NOW, blocked="no worker")
    assert (done.eta_seconds, done.blocked) == (0.0, None)
