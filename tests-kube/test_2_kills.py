"""Pods killed mid-work (`kubectl delete pod --grace-period=0 --force`, what a lost node does):
nothing lost, nothing applied twice, the work taken up again by the replacement pods."""

from __future__ import annotations

import time
import uuid

import pytest
from pin_e2e.checks import MembershipPlan
from pin_kube import (
    IDENTITY,
    REWARDS,
    assert_complete,
    delivered,
    differences,
    inbox_count,
    kill,
    pods,
    ready_count,
    record,
    start_fanout,
    task_status,
)

from pin_testkit.waiting import wait_until


@pytest.mark.timeout(900)
def test_workers_killed_mid_fanout_lose_nothing() -> None:
    fanout = start_fanout(20000)
    assert fanout.task is not None
    task = fanout.task
    # Mid-fan-out: some pages done, most still to do.
    wait_until(lambda: task_status(task)[1] > 0, 120, "the fan-out under way")
    status, done = task_status(task)
    assert status != "Completed", "the fan-out ended before the kill"
    assert done < len(fanout.users)
    for pod in pods(IDENTITY, "worker"):
        kill(pod.name)
    # The replacements claim the task once the killed lease expires (config.maxLeaseDuration).
    delivery = delivered(fanout, timeout=600)
    assert_complete(delivery)
    assert task_status(task)[1] >= len(fanout.users)


@pytest.mark.timeout(900)
def test_consumer_killed_mid_batch_applies_each_change_once() -> None:
    plan = MembershipPlan.random(agents=400, agencies=200, changes=4000, seed=uuid.uuid4().int)
    before = inbox_count()
    record(plan.changes)
    # Mid-batch: the consumers have applied part of what was recorded.
    wait_until(lambda: inbox_count() > before, 120, "the consumers applying")
    assert inbox_count() < before + len(plan.changes), "the consumers caught up before the kill"
    victims = pods(REWARDS, "consumer")
    killed_at = time.monotonic()
    for pod in victims:
        kill(pod.name)
    wait_until(lambda: ready_count(REWARDS, "consumer") >= 1, 180, "a replacement consumer ready")
    resumed_from = inbox_count()
    wait_until(
        lambda: inbox_count() > resumed_from or not differences(plan.agents),
        120,
        "the replacement consumers applying again",
    )
    resumed = time.monotonic() - killed_at
    wait_until(lambda: not differences(plan.agents), 300, "the rewards projection equals identity")
    # applied == identity's Version for every pair: each change applied exactly once.
    assert not differences(plan.agents, plan.final)
    print(f"consumers killed: applying again {resumed:.1f} s after the kill")
