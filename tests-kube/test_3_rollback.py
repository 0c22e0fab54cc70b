"""`helm rollback` to the previous release and forward again, with a fan-out and membership
changes in flight: the older pods run on the newer schema (the migrations are expand-only,
and a rollback runs no migration), their logins keep their grants, and nothing is lost."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from pin_e2e.checks import MembershipPlan
from pin_kube import (
    IDENTITY,
    IDENTITY_DSN,
    REWARDS,
    REWARDS_DSN,
    assert_complete,
    delivered,
    differences,
    helm,
    install,
    ops,
    record,
    start_fanout,
    task_status,
    wait_rolled_out,
)

from pin_testkit.waiting import wait_until


def migrations(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT version FROM {schema}.schema_migrations ORDER BY 1").fetchall()
    return [str(r[0]) for r in rows]


def revision(release: str) -> int:
    history = json.loads(helm("history", release, "-o", "json"))
    return int(history[-1]["revision"])


@pytest.mark.timeout(1200)
def test_rollback_and_forward_with_work_in_flight() -> None:
    applied = {
        IDENTITY: migrations(IDENTITY_DSN, "identity"),
        REWARDS: migrations(REWARDS_DSN, "rewards"),
    }
    fanout = start_fanout(20000)
    assert fanout.task is not None
    task = fanout.task
    wait_until(lambda: task_status(task)[1] > 0, 120, "the fan-out under way")
    first = MembershipPlan.random(agents=100, agencies=50, changes=500, seed=uuid.uuid4().int)
    record(first.changes)

    for release in (IDENTITY, REWARDS):
        before = revision(release)
        # The release before this one: the previous version, as e2e.sh installed it first.
        helm("rollback", release, "1", "--wait", "--timeout", "5m")
        assert revision(release) == before + 1
        wait_rolled_out(release)
    # The older release runs on the newer schema, which the rollback left as it was.
    assert migrations(IDENTITY_DSN, "identity") == applied[IDENTITY]
    assert migrations(REWARDS_DSN, "rewards") == applied[REWARDS]
    # Its logins still hold their grants: runbook commands of the older ops pods (those both
    # releases have).
    ops(IDENTITY, "tasks", "list")
    ops(IDENTITY, "outbox", "status")
    ops(REWARDS, "dlq", "list")
    second = MembershipPlan.random(agents=100, agencies=50, changes=500, seed=uuid.uuid4().int)
    record(second.changes)

    install(IDENTITY)
    install(REWARDS)
    assert migrations(IDENTITY_DSN, "identity") == applied[IDENTITY]
    assert migrations(REWARDS_DSN, "rewards") == applied[REWARDS]
    ops(IDENTITY, "status")
    ops(REWARDS, "status")
    assert_complete(delivered(fanout, timeout=600))
    agents = [*first.agents, *second.agents]
    wait_until(lambda: not differences(agents), 300, "the rewards projection equals identity")
    assert not differences(first.agents, first.final)
    assert not differences(second.agents, second.final)
