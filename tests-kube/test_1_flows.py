"""The flows on pods: a fan-out, membership changes applied, poison records to the DLQ."""

from __future__ import annotations

import json
import uuid

from pin_e2e.checks import MembershipPlan
from pin_e2e.poison import empty_agent_event, membership_event, raw_record
from pin_kube import (
    IDENTITY,
    KAFKA,
    REWARDS,
    assert_complete,
    delivered,
    differences,
    ops,
    record,
    start_fanout,
)

from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    IDENTITY_MEMBERSHIP_DLQ,
    REWARDS_MEMBERSHIP_CONSUMER_GROUP,
    REWARDS_MEMBERSHIP_EVENT_INVALID,
    DeadLetterInfo,
)
from pin_testkit.records import end_offsets, produce, read_topic
from pin_testkit.waiting import wait_until


def test_a_queued_fanout_reaches_every_holder() -> None:
    fanout = start_fanout(3000)
    assert fanout.task is not None, "3,000 holders is above the inline threshold"
    delivery = delivered(fanout)
    assert_complete(delivery)


def test_membership_changes_are_applied_once_each() -> None:
    plan = MembershipPlan.random(agents=40, agencies=30, changes=300, seed=uuid.uuid4().int)
    record(plan.changes)
    # One more through the ops pod, as the Deploy guide's check does.
    agent, agency = uuid.uuid4(), uuid.uuid4()
    joined = json.loads(ops(IDENTITY, "memberships", "join", str(agent), str(agency), "--json"))
    assert joined
    agents = [*plan.agents, agent]
    wait_until(lambda: not differences(agents), 120, "the rewards projection equals identity")
    assert not differences(plan.agents, plan.final)
    shown = ops(REWARDS, "agent", "show", str(agent))
    assert str(agency) in shown


def test_poison_records_go_to_the_dlq_and_the_flow_goes_on() -> None:
    agency = uuid.uuid4()
    not_json = raw_record(membership_event(uuid.uuid4(), agency), b"{not json")
    empty_agent = empty_agent_event(agency)
    dlq_start = dict(end_offsets(KAFKA, IDENTITY_MEMBERSHIP_DLQ.name))
    at = produce(KAFKA, AGENT_MEMBERSHIP_CHANGED.name, [not_json, empty_agent])
    # A valid change after them: applied although the two before it are refused.
    plan = MembershipPlan.random(agents=3, agencies=3, changes=6, seed=uuid.uuid4().int)
    record(plan.changes)

    def dead_letters() -> list[DeadLetterInfo]:
        records = read_topic(KAFKA, IDENTITY_MEMBERSHIP_DLQ.name, dlq_start)
        return [
            DeadLetterInfo.from_headers(r.headers)
            for r in records
            if (r.key, r.value) in {(not_json[0], not_json[1]), (empty_agent[0], empty_agent[1])}
        ]

    wait_until(lambda: len(dead_letters()) == 2, 120, "both poison records dead-lettered")
    infos = dead_letters()
    assert {i.error_code for i in infos} == {REWARDS_MEMBERSHIP_EVENT_INVALID}
    assert {(i.original_partition, i.original_offset) for i in infos} == {
        (d.partition, d.offset) for d in at
    }
    assert {i.original_consumer_group for i in infos} == {REWARDS_MEMBERSHIP_CONSUMER_GROUP}
    wait_until(lambda: not differences(plan.agents), 120, "the changes after them applied")
    assert not differences(plan.agents, plan.final)
