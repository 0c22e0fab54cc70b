"""Scenario 1: a role of 2,500 users changes permissions; every user gets a full snapshot."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from pin_e2e.report import Recorder
from pin_e2e.steps import change_role_permissions, seed_role, task_row
from pin_e2e.system import System
from pin_e2e.verify import access_delivered, record_access, wait_task_drained

pytestmark = pytest.mark.integration

USERS = 2_500
BATCH_SIZE = 100


def test_role_of_2500_users_changes_permissions(
    make_system: Callable[[str], System], recorder: Recorder
) -> None:
    with recorder.scenario(1, "role of 2,500 users changes permissions") as stats:
        system = make_system("s1")
        role, users = seed_role(system, users=USERS, code="s1-role")
        worker = system.worker(BATCH_SIZE=str(BATCH_SIZE)).start()
        worker.wait_ready()

        change = change_role_permissions(system, role, "s1-role")
        assert change.mode == "queued"
        assert change.task is not None
        task = change.task
        wait_task_drained(
            system, task, what="task Completed and the outbox drained", alive=[worker]
        )

        delivery = access_delivered(system, users, change.version)
        record_access(stats, delivery)
        # No fault: exactly one event per user, all of one fan-out run.
        assert delivery.duplicates == 0
        assert len(delivery.correlation_ids) == 1

        row = task_row(system, task)
        assert (row["processed_count"], row["attempt_count"]) == (USERS, 1)
        shown = json.loads(system.identity_cli("tasks", "show", str(task), "--json").stdout)
        assert (shown["task"]["status"], shown["task"]["processed_count"]) == ("Completed", USERS)

        metrics = worker.metrics()
        assert metrics["identity_access_fanout_users_total"] == USERS
        assert metrics['identity_access_fanout_tasks_total{outcome="completed"}'] == 1
        assert metrics["identity_access_fanout_batches_total"] >= USERS // BATCH_SIZE
        assert metrics["identity_access_fanout_size_count"] == 1
        assert metrics["identity_access_fanout_size_sum"] == USERS
        assert metrics["identity_outbox_published_total"] == USERS
        assert metrics["identity_outbox_relay_active"] == 1
        assert metrics["identity_access_fanout_failed_tasks"] == 0

        assert worker.terminate() == 0
