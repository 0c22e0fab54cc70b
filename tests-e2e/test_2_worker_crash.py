"""Scenario 2: ``kill -9`` of the fan-out worker mid-task, then a restart."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pin_e2e.report import Recorder
from pin_e2e.steps import change_role_permissions, outbox_backlog, seed_role, task_row
from pin_e2e.system import System
from pin_e2e.verify import access_delivered, record_access, wait_checkpointed, wait_task_drained

pytestmark = pytest.mark.integration

USERS = 2_500
BATCH_SIZE = 100
KILL_AT = 700  # users checkpointed before the crash: well inside the task
HELD_AT = 1_000
"""The first worker publishes nothing (`--no-relay`) and waits once the outbox holds this
many rows (MAX_OUTBOX_BACKLOG), its claim kept: the crash strikes between 700 and 1,000
users (in practice at 1,000, the worker waiting), however fast the batches run; a polled
count alone once let a fast worker finish all 2,500 before the kill landed."""


def test_worker_killed_mid_task_then_restarted(
    make_system: Callable[[str], System], recorder: Recorder
) -> None:
    with recorder.scenario(2, "kill -9 of the fan-out worker mid-task, restart") as stats:
        system = make_system("s2")
        role, users = seed_role(system, users=USERS, code="s2-role")
        first = system.worker(
            "worker-1", "--no-relay", BATCH_SIZE=str(BATCH_SIZE), MAX_OUTBOX_BACKLOG=str(HELD_AT)
        ).start()
        first.wait_ready()

        change = change_role_permissions(system, role, "s2-role")
        assert change.task is not None
        task = change.task
        wait_checkpointed(system, task, KILL_AT, alive=[first])
        first.kill()
        at_crash = task_row(system, task)
        assert at_crash["status"] == "InProgress", "the crash must come before the task ended"
        assert at_crash["processed_count"] < USERS
        stats.fault(f"kill -9 worker at {at_crash['processed_count']}/{USERS} users")
        stats.notes.append(
            f"worker killed at {at_crash['processed_count']}/{USERS} users checkpointed, "
            f"{outbox_backlog(system)} outbox rows unpublished"
        )

        # A new process; the crashed one's lease (MaxLeaseDuration 8 s) lapses, then it resumes
        # the task from the checkpoint (the claim increments AttemptCount).
        second = system.worker("worker-2", BATCH_SIZE=str(BATCH_SIZE)).start()
        second.wait_ready()
        wait_task_drained(
            system,
            task,
            what="task Completed after the restart and the outbox drained",
            alive=[second],
        )

        delivery = access_delivered(system, users, change.version)
        record_access(stats, delivery)
        # A restart repeats at most the batch that was in flight: at most one event more per
        # user of one batch (relay re-sends of the same message are counted apart).
        assert delivery.fanout_duplicates <= BATCH_SIZE
        assert delivery.max_fanout_copies <= 2

        row = task_row(system, task)
        assert row["processed_count"] == USERS
        assert row["attempt_count"] == 2
        metrics = second.metrics()
        assert metrics["identity_access_fanout_users_total"] == USERS - at_crash["processed_count"]
        assert metrics['identity_access_fanout_tasks_total{outcome="completed"}'] == 1
        assert second.terminate() == 0
