"""Scenario 6: PostgreSQL stopped mid-flow, then started; nothing lost, nothing applied twice.

The one server holds both databases (identity's and rewards'), as a small installation
would: ``pg_ctl stop -m fast`` cuts the fan-out worker, its relay and the rewards consumer off
at once. Membership changes are recorded before the outage and after it (a change whose
COMMIT an outage cuts off has an unknown outcome, which the identity API would report to its
caller; the plan here must know every change).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from uuid import UUID

import pytest
from pin_e2e import verify
from pin_e2e.checks import MembershipPlan
from pin_e2e.report import Recorder, ScenarioStats
from pin_e2e.steps import (
    applied_total,
    change_role_permissions,
    inbox_count,
    outbox_backlog,
    record_changes,
    seed_role,
    task_row,
)
from pin_e2e.system import System

from pin_testkit.service import ServiceProcess
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

USERS = 2_500
BATCH_SIZE = 50
CHANGES_BEFORE, CHANGES_AFTER = 800, 200
DOWN_FOR = 5.0  # the outage itself: a deliberate hold
# Low marks: the outage must land while at least one flow still has work, and on a fast run
# both finish within a few polls of crossing a high one.
STOP_AT_USERS, STOP_AT_RECORDS = 2 * BATCH_SIZE, 30


def database_outage(
    system: System, task: UUID, services: list[ServiceProcess], stats: ScenarioStats
) -> None:
    """Stop PostgreSQL once both flows are under way, hold it down, start it again."""
    worker, consumer = services
    wait_until(
        lambda: (
            task_row(system, task)["processed_count"] >= STOP_AT_USERS
            or inbox_count(system) >= STOP_AT_RECORDS
        ),
        timeout=120,
        what="both flows under way",
        interval=0.02,
        alive=services,
    )
    progress = task_row(system, task)["processed_count"]
    applied_then = inbox_count(system)
    system.servers.stop_postgres()
    stopped_at = time.monotonic()
    stats.mark("PostgreSQL stopped")
    stats.fault(f"PostgreSQL stopped {DOWN_FOR:.0f}s (pg_ctl stop -m fast)")
    # The worker notices: /readyz stops answering 200 while its database is away.
    wait_until(
        lambda: not worker.ready(),
        timeout=DOWN_FOR + 30,
        what="worker /readyz degraded",
        alive=services,
    )
    time.sleep(max(0.0, DOWN_FOR - (time.monotonic() - stopped_at)))
    consumer_ready_during = consumer.ready()
    system.servers.restart_stopped()
    stats.mark("PostgreSQL back")
    stats.notes.append(
        f"database stopped at {progress}/{USERS} users checkpointed and "
        f"{applied_then}/{CHANGES_BEFORE} records consumed; consumer /readyz during the "
        f"outage: {'200' if consumer_ready_during else 'degraded'}"
    )
    assert progress < USERS or applied_then < CHANGES_BEFORE, "the outage came after the flows"


def test_database_stopped_mid_flow(
    make_system: Callable[[str], System], recorder: Recorder
) -> None:
    with recorder.scenario(6, "PostgreSQL stopped mid-flow") as stats:
        system = make_system("s6")
        role, users = seed_role(system, users=USERS, code="s6-role")
        total = CHANGES_BEFORE + CHANGES_AFTER
        plan = MembershipPlan.random(agents=150, agencies=15, changes=total, seed=6)
        worker = system.worker(BATCH_SIZE=str(BATCH_SIZE)).start()
        worker.wait_ready()
        record_changes(system, plan.changes[:CHANGES_BEFORE])
        wait_until(lambda: outbox_backlog(system) == 0, timeout=60, what="memberships published")
        stats.mark("800 changes on Kafka")

        # Both paths start together: the fan-out of the role and the consumer's catch-up.
        consumer = system.consumer(BATCH_SIZE="10").start()
        change = change_role_permissions(system, role, "s6-role")
        assert change.task is not None
        task = change.task
        database_outage(system, task, [worker, consumer], stats)

        record_changes(system, plan.changes[CHANGES_BEFORE:])
        verify.wait_task_drained(
            system,
            task,
            what="task Completed and the outbox drained after the outage",
            interval=0.25,
            alive=[worker, consumer],
        )
        verify.wait_converged(system, plan, alive=[worker, consumer])
        stats.mark("converged")

        # Access path: every user, at most one repeated batch; the checkpoint counted each once.
        delivery = verify.access_delivered(system, users, change.version)
        assert delivery.fanout_duplicates <= BATCH_SIZE
        assert task_row(system, task)["processed_count"] == USERS
        # Membership path: rows equal identity's and each change was applied exactly once (the
        # row's version counts applied changes and equals identity's Version; checked by
        # projection_converged), with one inbox mark each.
        message_ids = verify.membership_message_ids(system)
        assert len(set(message_ids)) == total
        assert inbox_count(system) == total
        metrics = consumer.metrics()
        assert applied_total(metrics) == total
        retries = {
            k: int(v)
            for k, v in metrics.items()
            if k.startswith("rewards_membership_retries_total")
        }
        stats.notes.append(f"consumer retries: {retries or 'none'}")

        verify.record_both_paths(
            stats,
            delivery,
            message_ids,
            total,
            {"access re-fanned": delivery.fanout_duplicates},
        )
        stats.duplicate(
            "membership re-consumed (skipped)",
            int(metrics["rewards_membership_skipped_duplicate_total"]),
        )
        assert worker.terminate() == 0
        assert consumer.terminate() == 0
