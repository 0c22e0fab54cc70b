"""Scenario 5: the Kafka broker stopped for 10 s mid-flow, then started; nothing lost.

Both paths run across the outage. Membership changes are recorded in identity before it,
during it and after it (outbox -> relay -> ``pin.identity.agent-membership-changed.v1`` ->
rewards consumer): the broker stops once the consumer has applied some of them, while the
rest keep arriving. A role's permissions change during the outage, and its 2,500-user
fan-out (worker -> outbox -> relay -> ``pin.identity.access.v1``) runs into the outage: the
worker holds at MAX_OUTBOX_BACKLOG rows that the relay cannot publish, so the broker comes
back mid-task by construction (an earlier version stopped the broker once a poll saw the
task part-done, and a fast worker finished first). Identity's database stays up, so the
changes keep being recorded and wait in the outbox.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from pin_e2e.checks import MembershipPlan
from pin_e2e.report import Recorder
from pin_e2e.steps import (
    BackgroundRecorder,
    change_role_permissions,
    inbox_count,
    outbox_backlog,
    seed_role,
    task_row,
)
from pin_e2e.system import System
from pin_e2e.verify import (
    access_delivered,
    membership_message_ids,
    record_both_paths,
    wait_converged,
    wait_task_drained,
)

from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

USERS = 2_500
BATCH_SIZE = 50
HELD_AT = 500
"""The worker waits once this many rows wait in the outbox (MAX_OUTBOX_BACKLOG): with the
broker down nothing leaves it, so the fan-out holds at most HELD_AT + BATCH_SIZE users in,
far from its 2,500, until the broker is back."""
DOWN_FOR = 10.0  # the outage itself: a deliberate hold, not a wait for a condition
CHANGES = 600
APPLIED_BEFORE = 50  # membership changes applied by the consumer before the broker stops
PACE = 0.015  # seconds between two recorded membership changes: they span the outage


def test_broker_stopped_for_ten_seconds(
    make_system: Callable[[str], System], recorder: Recorder
) -> None:
    with recorder.scenario(5, "Kafka broker stopped 10 s mid-flow") as stats:
        system = make_system("s5")
        role, users = seed_role(system, users=USERS, code="s5-role")
        plan = MembershipPlan.random(agents=100, agencies=10, changes=CHANGES, seed=5)
        # Deliveries time out after 5 s (not 30 s), so the relay notices the outage while it
        # lasts and backs off; it must still publish everything afterwards.
        worker = system.worker(
            BATCH_SIZE=str(BATCH_SIZE), MAX_OUTBOX_BACKLOG=str(HELD_AT), RELAY_DELIVERY_TIMEOUT="5s"
        ).start()
        consumer = system.consumer().start()
        worker.wait_ready()
        consumer.wait_ready()
        stats.mark("services ready")

        # Half the changes before the outage (the broker stops once some are applied, the
        # rest of the half still arriving), the other half while it lasts.
        half = CHANGES // 2
        changes = BackgroundRecorder(system, plan.changes[:half], PACE).start()
        wait_until(
            lambda: inbox_count(system) >= APPLIED_BEFORE,
            timeout=120,
            what=f"{APPLIED_BEFORE} membership changes applied before the outage",
            alive=[worker, consumer],
        )
        recorded_then = changes.recorded
        stopped_in = system.servers.stop_kafka()
        stopped_at = time.monotonic()
        stats.mark("broker stopped")
        stats.fault(f"broker stopped {DOWN_FOR:.0f}s (SIGTERM)")

        # While it is down: identity keeps working; its events wait in the outbox, and the
        # fan-out holds once the outbox is full.
        # The plan's later changes may leave what its first half joins: they start once the
        # first half is recorded (its rest recorded while the broker is down).
        assert changes.join() == half
        late = BackgroundRecorder(system, plan.changes[half:], PACE).start()
        change = change_role_permissions(system, role, "s5-role")
        assert change.task is not None
        task = change.task
        wait_until(
            lambda: worker.metric("identity_access_fanout_throttled") == 1,
            timeout=120,
            what=f"the fan-out holding at {HELD_AT} outbox rows",
            alive=[worker, consumer],
        )
        assert late.join() == CHANGES - half  # recorded while the broker was down
        backlog_during = outbox_backlog(system)
        time.sleep(max(0.0, DOWN_FOR - (time.monotonic() - stopped_at)))
        progress = task_row(system, task)["processed_count"]
        backlog_end = outbox_backlog(system)
        worker_ready_during = worker.ready()
        restart_took = system.servers.restart_stopped()
        stats.mark("broker answering again")
        stats.notes.append(
            f"broker stopped with {recorded_then}/{CHANGES} changes recorded (stop took "
            f"{stopped_in:.1f}s, restart {restart_took:.1f}s); the fan-out held at "
            f"{progress}/{USERS} users checkpointed; outbox {backlog_during} -> {backlog_end} "
            f"rows during the outage; worker /readyz during the outage: "
            f"{'200' if worker_ready_during else 'degraded'}"
        )
        assert progress <= HELD_AT + BATCH_SIZE, "the fan-out went past the outbox's cap"
        assert backlog_end >= HELD_AT, "nothing waited in the outbox during the outage"

        wait_task_drained(
            system,
            task,
            what="task Completed and the outbox drained after the broker came back",
            interval=0.25,
            alive=[worker, consumer],
        )
        stats.mark("outbox drained")

        wait_converged(system, plan, alive=[worker, consumer])
        stats.mark("projection converged")

        delivery = access_delivered(system, users, change.version)
        assert delivery.fanout_duplicates == 0  # the worker never stopped: no batch repeated
        message_ids = membership_message_ids(system)
        assert len(set(message_ids)) == CHANGES

        record_both_paths(stats, delivery, message_ids, CHANGES)
        assert worker.terminate() == 0
        assert consumer.terminate() == 0
