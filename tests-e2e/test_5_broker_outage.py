"""Scenario 5: the Kafka broker stopped for 10 s mid-flow, then started; nothing lost.

Both paths run while the broker goes away: a 2,500-user fan-out (worker -> outbox -> relay ->
``pin.identity.access.v1``) and membership changes recorded in identity the whole time
(outbox -> relay -> ``pin.identity.agent-membership-changed.v1`` -> rewards consumer).
Identity's database stays up, so the changes keep being recorded and wait in the outbox.
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
    outbox_backlog,
    seed_role,
    task_row,
)
from pin_e2e.system import System
from pin_e2e.verify import (
    access_delivered,
    membership_message_ids,
    record_both_paths,
    wait_checkpointed,
    wait_converged,
    wait_task_drained,
)

pytestmark = pytest.mark.integration

USERS = 2_500
BATCH_SIZE = 10  # small batches: the fan-out of 2,500 users lasts long enough to strike inside it
# on a loaded machine too, where a 20 ms poll can stall for most of a second
STOP_AT = 300  # users checkpointed when the broker is stopped
DOWN_FOR = 10.0  # the outage itself: a deliberate hold, not a wait for a condition
CHANGES = 600
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
        worker = system.worker(BATCH_SIZE=str(BATCH_SIZE), RELAY_DELIVERY_TIMEOUT="5s").start()
        consumer = system.consumer().start()
        worker.wait_ready()
        consumer.wait_ready()
        stats.mark("services ready")

        changes = BackgroundRecorder(system, plan.changes, PACE).start()
        change = change_role_permissions(system, role, "s5-role")
        assert change.task is not None
        task = change.task
        wait_checkpointed(system, task, STOP_AT, alive=[worker, consumer])
        progress = task_row(system, task)["processed_count"]
        recorded_then = changes.recorded
        unpublished = outbox_backlog(system)
        stopped_in = system.servers.stop_kafka()
        stopped_at = time.monotonic()
        stats.mark("broker stopped")
        stats.fault(f"broker stopped {DOWN_FOR:.0f}s (SIGTERM)")

        # While it is down: identity keeps working; its events wait in the outbox.
        backlog_during = outbox_backlog(system)
        time.sleep(max(0.0, DOWN_FOR - (time.monotonic() - stopped_at)))
        backlog_end = outbox_backlog(system)
        worker_ready_during = worker.ready()
        restart_took = system.servers.restart_stopped()
        stats.mark("broker answering again")
        stats.notes.append(
            f"broker stopped at {progress}/{USERS} users checkpointed, {recorded_then}/"
            f"{CHANGES} changes recorded, {unpublished} outbox rows unpublished (stop took "
            f"{stopped_in:.1f}s, "
            f"restart {restart_took:.1f}s); "
            f"outbox {backlog_during} -> {backlog_end} rows during the outage; worker /readyz "
            f"during the outage: {'200' if worker_ready_during else 'degraded'}"
        )
        assert progress < USERS, "the broker must stop while the fan-out runs"
        assert backlog_end > 0, "nothing waited in the outbox during the outage"

        assert changes.join() == CHANGES
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
