"""Scenario 3: two fan-out workers and ten tasks; each task is processed by one worker."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

import psycopg
import pytest
from pin_e2e.checks import analyse_access, expected_snapshots
from pin_e2e.report import Recorder
from pin_e2e.steps import outbox_backlog, seed_role, task_row
from pin_e2e.system import System

from identity_fanout.fanout.enqueue import set_role_permissions
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

OUTBOX_LANES = 8  # IDENTITY_FANOUT_OUTBOX_LANES: the default, the workers set no other

TASKS = 10
USERS_PER_ROLE = 300
BATCH_SIZE = 50
THRESHOLD = 50  # roles above it are queued as tasks


def test_two_workers_share_ten_tasks(
    make_system: Callable[[str], System], recorder: Recorder
) -> None:
    with recorder.scenario(3, "two fan-out workers, ten tasks") as stats:
        system = make_system("s3")
        roles = [seed_role(system, users=USERS_PER_ROLE, code=f"s3-role-{i}") for i in range(TASKS)]
        workers = [system.worker(f"worker-{n}", BATCH_SIZE=str(BATCH_SIZE)).start() for n in (1, 2)]
        for worker in workers:
            worker.wait_ready()

        # Ten permission changes recorded by the identity API (in-process, one transaction each).
        changes: list[tuple[UUID, int, list[UUID]]] = []
        with psycopg.connect(system.identity_dsn, autocommit=True) as conn:
            for i, (role, users) in enumerate(roles):
                change = set_role_permissions(
                    conn,
                    role,
                    [f"s3-role-{i}.read", f"s3-role-{i}.write"],
                    inline_threshold=THRESHOLD,
                )
                assert change.mode == "queued"
                assert change.task_id is not None
                changes.append((change.task_id, change.version, users))

        wait_until(
            lambda: (
                all(task_row(system, t)["status"] == "Completed" for t, _, _ in changes)
                and outbox_backlog(system) == 0
            ),
            timeout=240,
            what="ten tasks Completed and the outbox drained",
            interval=0.2,
            alive=workers,
        )

        records = system.access_records()
        lost = 0
        for task, version, users in changes:
            row = task_row(system, task)
            # One claim per task: no task was taken from a live worker by the other.
            assert (row["attempt_count"], row["processed_count"]) == (1, USERS_PER_ROLE)
            delivery = analyse_access(
                records, users=expected_snapshots(system.identity_dsn, users), version=version
            )
            stats.events += delivery.distinct_events
            lost += len(delivery.lost)
            stats.duplicate("re-fanned", delivery.fanout_duplicates)
            stats.duplicate("redelivered", delivery.relay_redeliveries)
            assert delivery.lost == []
            assert delivery.wrong_snapshots == []
            assert delivery.duplicates == 0
            # Every event of the task carries the jobRunId of one run: one worker did it all.
            assert len(delivery.correlation_ids) == 1
        stats.lost = lost

        per_worker = [w.metrics() for w in workers]
        completed = [
            int(m['identity_access_fanout_tasks_total{outcome="completed"}']) for m in per_worker
        ]
        fanned = [int(m["identity_access_fanout_users_total"]) for m in per_worker]
        stats.notes.append(f"tasks per worker: {completed}; users per worker: {fanned}")
        assert sum(completed) == TASKS
        assert sum(fanned) == TASKS * USERS_PER_ROLE

        # The two relays share the outbox lanes: each lane has one holder (advisory locks),
        # and once balanced both publish.
        def lanes_held() -> list[int]:
            return [int(w.metrics()["identity_outbox_lanes_held"]) for w in workers]

        wait_until(
            lambda: sum(lanes_held()) == OUTBOX_LANES and min(lanes_held()) >= 1,
            timeout=30,
            what=f"the {OUTBOX_LANES} lanes shared by both relays",
            alive=workers,
        )
        assert [m["identity_outbox_relay_active"] for m in (w.metrics() for w in workers)] == [
            1,
            1,
        ]
        for worker in workers:
            assert worker.terminate() == 0
