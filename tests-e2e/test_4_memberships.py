"""Scenario 4: 2,000 membership changes of 300 agents in 20 agencies reach the projection.

Recorded in identity (the identity API's function, one transaction each; the last few through
the ``identity-fanout memberships`` CLI), published by the worker's relay, applied by
``rewards-membership consume``, which is killed with SIGKILL midway and restarted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
import pytest
from pin_e2e.checks import (
    MembershipPlan,
    identity_memberships,
    membership_differences,
    rewards_rows,
)
from pin_e2e.report import Recorder
from pin_e2e.steps import (
    applied_total,
    inbox_count,
    outbox_backlog,
    record_changes,
    record_changes_cli,
)
from pin_e2e.system import CONSUMER, System
from pin_e2e.verify import wait_converged

from pin_contracts import AGENT_MEMBERSHIP_CHANGED, decode_membership_changed
from pin_testkit.records import commit_group_offsets
from pin_testkit.runtime_roles import login_name
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration


def consumer_sessions(system: System) -> int:
    """Server sessions of the consumer's login on the scenario's rewards database."""
    with psycopg.connect(system.rewards_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE usename = %s AND datname = current_database()",
            (login_name(*CONSUMER),),
        ).fetchone()
    assert row is not None
    return int(row[0])


Rows = dict[tuple[UUID, UUID], dict[str, Any]]

AGENTS, AGENCIES, CHANGES = 300, 20, 2_000
BY_CLI = 3
KILL_AFTER = 300  # records the consumer has processed before it is killed


def replay_changes_nothing(system: System, projection: Rows, records: int) -> None:
    """Consume the whole scenario again from its first record: no row may change."""
    commit_group_offsets(
        system.bootstrap, system.group, AGENT_MEMBERSHIP_CHANGED.name, system.membership_start
    )
    replay = system.consumer("consumer-3").start()
    wait_until(
        lambda: (
            replay.ready()
            and replay.metrics()["rewards_membership_skipped_duplicate_total"] >= records
        ),
        timeout=120,
        what="every record consumed again",
        interval=0.25,
        alive=[replay],
    )
    assert rewards_rows(system.rewards_dsn, list({a for a, _ in projection})) == projection
    assert replay.terminate() == 0


def test_membership_changes_reach_the_projection(
    make_system: Callable[[str], System], recorder: Recorder
) -> None:
    with recorder.scenario(4, "2,000 membership changes, consumer kill -9 midway") as stats:
        system = make_system("s4")
        plan = MembershipPlan.random(agents=AGENTS, agencies=AGENCIES, changes=CHANGES, seed=4)
        worker = system.worker().start()
        worker.wait_ready()

        half = CHANGES // 2
        record_changes(system, plan.changes[:half])
        stats.mark("1,000 recorded")
        consumer = system.consumer("consumer-1", BATCH_SIZE="20").start()
        wait_until(
            lambda: inbox_count(system) >= KILL_AFTER,
            timeout=120,
            what=f"{KILL_AFTER} records consumed",
            interval=0.02,
            alive=[worker, consumer],
        )
        consumer.kill()
        stats.mark("consumer killed")
        # A COMMIT the process sent just before it died still completes on the server: count
        # once its sessions are gone, then the figure is exact.
        wait_until(
            lambda: consumer_sessions(system) == 0,
            timeout=30,
            what="the killed consumer's database sessions ended",
        )
        at_crash = inbox_count(system)
        stats.fault(f"kill -9 consumer after {at_crash}/{CHANGES} records")

        # The rest happens while no consumer runs; the last few through the CLI.
        record_changes(system, plan.changes[half:-BY_CLI])
        record_changes_cli(system, plan.changes[-BY_CLI:])
        stats.mark("2,000 recorded")
        # The same group: its partitions come back once the broker gives up on the killed
        # member (REWARDS_MEMBERSHIP_KAFKA_SESSION_TIMEOUT, 8 s in this suite).
        restarted = system.consumer("consumer-2").start()
        wait_converged(system, plan, alive=[worker, restarted])
        stats.mark("converged")
        assert outbox_backlog(system) == 0
        projection = rewards_rows(system.rewards_dsn, plan.agents)
        identity = identity_memberships(system.identity_dsn, plan.agents)
        assert membership_differences(plan.final, identity, projection) == []
        assert len(projection) == len(plan.final)

        message_ids = [
            decode_membership_changed(r.value).message_id for r in system.membership_records()
        ]
        assert len(set(message_ids)) == CHANGES
        assert inbox_count(system) == CHANGES  # one idempotency mark per event, none twice
        # The consumer reports a batch's outcomes at its next poll (after its commit): wait
        # for the last batch's report before reading the counters.
        wait_until(
            lambda: applied_total(restarted.metrics()) >= CHANGES - at_crash,
            timeout=30,
            what="the restarted consumer reported its last batch",
        )
        metrics = restarted.metrics()
        redelivered = int(metrics["rewards_membership_skipped_duplicate_total"])
        # Exactly what the crashed consumer had not committed to the database was applied after
        # the restart; what it had applied but not acknowledged came again and was skipped.
        assert applied_total(metrics) == CHANGES - at_crash
        assert metrics["rewards_membership_skipped_stale_total"] == 0
        assert restarted.terminate() == 0

        replay_changes_nothing(system, projection, len(message_ids))
        stats.mark("replayed from the start")
        stats.events = len(set(message_ids))
        stats.lost = CHANGES - len(set(message_ids))
        stats.duplicate("redelivered by relay", len(message_ids) - len(set(message_ids)))
        stats.duplicate("re-consumed after the crash (skipped by inbox)", redelivered)
        stats.notes.append(
            f"consumer killed after {at_crash} records; the restart re-consumed {redelivered} "
            f"already applied; a full replay of {len(message_ids)} records changed no row"
        )
        assert worker.terminate() == 0
