"""`helm upgrade` from the previous release (its chart and its image, infra/kube/previous.sh,
installed by infra/kube/e2e.sh with the same values file) to this checkout's, with work in
flight: a fan-out under way and membership changes arriving. The migration hook runs the new
migrations while the old pods work; the Deployments roll; nothing is lost, nothing applied
twice; the 0.1.0 values file keeps its image reference and its alerts."""

from __future__ import annotations

import json
import threading

from pin_e2e.checks import MembershipPlan

from pin_kube import (
    IDENTITY,
    REVISION,
    REWARDS,
    assert_complete,
    delivered,
    differences,
    install,
    kubectl,
    record,
    start_fanout,
    task_status,
)
from pin_testkit.waiting import wait_until


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


def test_upgrade_from_the_previous_release_with_work_in_flight() -> None:
    previous = {release: images(release) for release in (IDENTITY, REWARDS)}
    assert all(previous.values()) and not any(REVISION in i for s in previous.values() for i in s)
    fanout = start_fanout(20000)
    assert fanout.task is not None
    task = fanout.task
    wait_until(lambda: task_status(task)[1] > 0, 120, "the fan-out under way")
    plan = MembershipPlan.random(agents=200, agencies=100, changes=2000, seed=450)
    recorder = threading.Thread(target=record, args=(plan.changes,), daemon=True)
    recorder.start()

    install(IDENTITY)
    install(REWARDS)
    recorder.join(120)
    assert not recorder.is_alive()

    for release in (IDENTITY, REWARDS):
        assert images(release) == {f"{release}:{REVISION}"}, images(release)
        rules = json.loads(kubectl("get", "prometheusrules", "-l", f"app.kubernetes.io/instance={release}", "-o", "json"))
        assert rules["items"], f"{release}: the 0.1.0 values file lost its alerts"
    assert_complete(delivered(fanout, timeout=600))
    wait_until(lambda: not differences(plan.agents), 300, "the rewards projection equals identity")
    assert not differences(plan.agents, plan.final)
