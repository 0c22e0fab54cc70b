"""Verification blocks several scenarios end with: the role's task done and every user's
event right, the projection equal to identity, the figures of the summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from uuid import UUID

from pin_contracts import decode_membership_changed
from pin_e2e.checks import (
    AccessDelivery,
    MembershipPlan,
    analyse_access,
    expected_snapshots,
    identity_memberships,
    membership_differences,
    rewards_rows,
)
from pin_e2e.report import ScenarioStats
from pin_e2e.steps import outbox_backlog, projection_converged, quarantined, task_row
from pin_e2e.system import System
from pin_testkit.service import ServiceProcess
from pin_testkit.waiting import DEFAULT_INTERVAL, ConditionTimeoutError, wait_until

__all__ = [
    "access_delivered",
    "membership_message_ids",
    "record_access",
    "record_both_paths",
    "wait_checkpointed",
    "wait_converged",
    "wait_task_drained",
]

DRAIN_TIMEOUT = 180.0
CONVERGE_TIMEOUT = 180.0


def wait_checkpointed(
    system: System, task: UUID, users: int, *, alive: Sequence[ServiceProcess]
) -> float:
    """Until the task has checkpointed ``users`` users or more: the moment a scenario strikes
    mid-task (polled every 20 ms, so that it strikes close to that count)."""
    return wait_until(
        lambda: task_row(system, task)["processed_count"] >= users,
        timeout=120,
        what=f"{users} users checkpointed",
        interval=0.02,
        alive=alive,
    )


def wait_task_drained(
    system: System,
    task: UUID,
    *,
    what: str,
    alive: Sequence[ServiceProcess],
    interval: float = DEFAULT_INTERVAL,
) -> float:
    """Until the task is Completed and the relay has published every outbox row: an empty
    outbox with a row in quarantine is no drain (no scenario here sends a record Kafka
    refuses for good), so that fails at once, naming the rows and why."""

    def drained() -> bool:
        refused = quarantined(system)
        assert not refused, f"quarantined instead of published: {refused}"
        return task_row(system, task)["status"] == "Completed" and outbox_backlog(system) == 0

    return wait_until(drained, timeout=DRAIN_TIMEOUT, what=what, interval=interval, alive=alive)


def wait_converged(system: System, plan: MembershipPlan, alive: Sequence[ServiceProcess]) -> float:
    """Until the rewards projection of the plan's agents equals identity and the plan; when
    it does not, the failure names where they still differ."""
    try:
        return wait_until(
            projection_converged(system, plan.agents, plan.final),
            timeout=CONVERGE_TIMEOUT,
            what="projection equals identity",
            interval=0.5,
            alive=alive,
        )
    except ConditionTimeoutError as exc:
        problems = membership_differences(
            plan.final,
            identity_memberships(system.identity_dsn, plan.agents),
            rewards_rows(system.rewards_dsn, plan.agents),
        )
        shown = "\n".join(problems[:10])
        raise ConditionTimeoutError(
            f"{len(problems)} differences, the first ones:\n{shown}\n{exc}"
        ) from None


def access_delivered(system: System, users: Sequence[UUID], version: int) -> AccessDelivery:
    """The access topic's events of ``version``, checked: no user lost, every snapshot equal
    to identity's tables, every envelope field right."""
    delivery = analyse_access(
        system.access_records(),
        users=expected_snapshots(system.identity_dsn, users),
        version=version,
    )
    assert delivery.lost == []
    assert delivery.wrong_snapshots == []
    assert delivery.wrong_fields == []
    return delivery


def record_access(stats: ScenarioStats, delivery: AccessDelivery) -> None:
    """The summary's figures of the access path alone."""
    stats.events = delivery.distinct_events
    stats.lost = len(delivery.lost)
    stats.duplicate("re-fanned", delivery.fanout_duplicates)
    stats.duplicate("redelivered", delivery.relay_redeliveries)


def membership_message_ids(system: System) -> list[UUID]:
    """MessageId of every membership record of the scenario, repeats included."""
    return [decode_membership_changed(r.value).message_id for r in system.membership_records()]


def record_both_paths(
    stats: ScenarioStats,
    delivery: AccessDelivery,
    message_ids: Sequence[UUID],
    changes: int,
    extra_duplicates: Mapping[str, int] | None = None,
) -> None:
    """The summary's figures of both paths: ``changes`` membership changes were recorded."""
    distinct = len(set(message_ids))
    stats.events = delivery.distinct_events + distinct
    stats.lost = len(delivery.lost) + changes - distinct
    for kind, count in (extra_duplicates or {}).items():
        stats.duplicate(kind, count)
    stats.duplicate("access redelivered", delivery.relay_redeliveries)
    stats.duplicate("membership redelivered", len(message_ids) - distinct)
