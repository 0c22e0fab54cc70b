"""`helm upgrade` from the previous release (its chart and its image, infra/kube/previous.sh,
installed by infra/kube/e2e.sh with the same values file) to this checkout's, with work in
flight: a fan-out under way and a backlog of membership events before the consumers. The
migration hook runs the new migrations while the old pods work; the Deployments roll; nothing
is lost, nothing applied twice; the 0.1.0 values file keeps its image reference and its
alerts. The backlog is produced to the topic as identity's relay writes it: this checkout's
`join_agency` writes to tables of the newer schema, which the older release's does not have
yet (the identity API upgrades with its own release)."""

from __future__ import annotations

import json
import uuid

import pytest
from pin_e2e.checks import MembershipPlan, rewards_rows
from pin_e2e.poison import membership_event, raw_record
from pin_kube import (
    IDENTITY,
    KAFKA,
    REVISION,
    REWARDS,
    REWARDS_DSN,
    assert_complete,
    delivered,
    differences,
    install,
    kubectl,
    record,
    start_fanout,
    task_status,
)

from pin_contracts import AGENT_MEMBERSHIP_CHANGED
from pin_testkit.records import produce
from pin_testkit.waiting import wait_until

BACKLOG = 3000


def images(release: str) -> set[str]:
    found = json.loads(
        kubectl("get", "pods", "-l", f"app.kubernetes.io/instance={release}", "-o", "json")
    )
    return {
        c["image"]
        for item in found["items"]
        if "deletionTimestamp" not in item["metadata"]
        for c in item["spec"]["containers"]
    }


@pytest.mark.timeout(900)
def test_upgrade_from_the_previous_release_with_work_in_flight() -> None:
    previous = {release: images(release) for release in (IDENTITY, REWARDS)}
    assert all(previous.values())
    assert not any(REVISION in i for s in previous.values() for i in s), previous
    fanout = start_fanout(20000)
    assert fanout.task is not None
    task = fanout.task
    wait_until(lambda: task_status(task)[1] > 0, 120, "the fan-out under way")
    pairs = [(uuid.uuid4(), uuid.uuid4()) for _ in range(BACKLOG)]
    produce(
        KAFKA,
        AGENT_MEMBERSHIP_CHANGED.name,
        [raw_record(membership_event(agent, agency)) for agent, agency in pairs],
    )

    install(IDENTITY)
    install(REWARDS)

    for release in (IDENTITY, REWARDS):
        assert images(release) == {f"{release}:{REVISION}"}, images(release)
        rules = json.loads(
            kubectl(
                "get",
                "prometheusrules",
                "-l",
                f"app.kubernetes.io/instance={release}",
                "-o",
                "json",
            )
        )
        assert rules["items"], f"{release}: the 0.1.0 values file lost its alerts"
    assert_complete(delivered(fanout, timeout=600))
    agents = [agent for agent, _ in pairs]

    def applied() -> int:
        return len(rewards_rows(REWARDS_DSN, agents))

    wait_until(lambda: applied() == BACKLOG, 300, "the membership backlog applied")
    rows = rewards_rows(REWARDS_DSN, agents)
    assert set(rows) == set(pairs)
    # Each event applied exactly once: the row's own version counts the changes applied.
    assert {(r["status"], r["last_membership_version"], r["applied"]) for r in rows.values()} == {
        ("Active", 1, 1)
    }
    # The chain on the upgraded releases: identity records, the relay publishes, rewards applies.
    plan = MembershipPlan.random(agents=50, agencies=30, changes=300, seed=uuid.uuid4().int)
    record(plan.changes)
    wait_until(lambda: not differences(plan.agents), 300, "the rewards projection equals identity")
    assert not differences(plan.agents, plan.final)
