"""Scenario 11: ``kill -9`` of the outbox relay mid-drain, then another relay.

The chart's topology: `worker --no-relay` fills the outbox with a whole task's events, then a
relay of its own drains it in small reads (5 rows each, 5 in flight), and is killed with
part of the outbox published and part not. A second relay takes the lanes over (the dead
one's advisory locks went with its connection) and publishes the rest: no user lost, no
event fanned out twice, no message sent more than once by each relay.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from pin_e2e.report import Recorder
from pin_e2e.steps import change_role_permissions, outbox_backlog, seed_role, task_row
from pin_e2e.system import System
from pin_e2e.verify import access_delivered, record_access

from pin_contracts import decode_access_changed
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

USERS = 5_000
IN_FLIGHT = 5  # RELAY_BATCH_SIZE and RELAY_WINDOW_RECORDS: a drain of many round trips
KILL_AFTER = 500  # rows published (deleted from the outbox) before the crash


def test_relay_killed_mid_drain_then_replaced(
    make_system: Callable[[str], System], recorder: Recorder
) -> None:
    with recorder.scenario(11, "kill -9 of the outbox relay mid-drain, another relay") as stats:
        system = make_system("s11")
        role, users = seed_role(system, users=USERS, code="s11-role")
        worker = system.worker("worker", "--no-relay", BATCH_SIZE="500").start()
        worker.wait_ready()
        change = change_role_permissions(system, role, "s11-role")
        assert change.task is not None
        task = change.task
        wait_until(
            lambda: task_row(system, task)["status"] == "Completed",
            timeout=120,
            what="task Completed, its events in the outbox",
            alive=[worker],
        )
        assert outbox_backlog(system) == USERS

        small = {"RELAY_BATCH_SIZE": str(IN_FLIGHT), "RELAY_WINDOW_RECORDS": str(IN_FLIGHT)}
        first = system.relay("relay-1", **small).start()
        wait_until(
            lambda: outbox_backlog(system) <= USERS - KILL_AFTER,
            timeout=120,
            what=f"{KILL_AFTER} outbox rows published",
            interval=0.02,
            alive=[first],
        )
        first.kill()
        left = outbox_backlog(system)
        assert 0 < left < USERS, "the crash must come while the outbox drains"
        stats.fault(f"kill -9 relay with {left}/{USERS} outbox rows unpublished")

        second = system.relay("relay-2").start()
        second.wait_ready()
        wait_until(
            lambda: outbox_backlog(system) == 0,
            timeout=180,
            what="the outbox drained by the second relay",
            alive=[second],
        )

        delivery = access_delivered(system, users, change.version)
        record_access(stats, delivery)
        assert delivery.fanout_duplicates == 0
        # Re-sent are only rows the first relay had sent and not yet deleted, each once more
        # by the second relay: no message more than twice.
        copies = Counter(decode_access_changed(r.value).message_id for r in system.access_records())
        assert max(copies.values()) <= 2  # one send per relay
        assert second.metrics()["identity_outbox_published_total"] >= left
        assert second.terminate() == 0
        assert worker.terminate() == 0
