"""A drain of the node honours the PodDisruptionBudgets: it evicts what each budget allows and
no more, and everything comes back once the node is uncordoned."""

from __future__ import annotations

import json
import subprocess

from pin_kube import IDENTITY, NODE, REWARDS, kubectl, ready_count, wait_rolled_out

# The components each chart gives a PodDisruptionBudget (maxUnavailable 1 by default).
BUDGETED = ((IDENTITY, "worker"), (IDENTITY, "relay"), (REWARDS, "consumer"))


def test_a_drain_stops_at_the_disruption_budgets() -> None:
    replicas = {
        (release, component): json.loads(
            kubectl("get", "deploy", f"{release}-{component}", "-o", "json")
        )["spec"]["replicas"]
        for release, component in BUDGETED
    }
    try:
        # One node: an evicted pod's replacement cannot be scheduled while the node is
        # cordoned, so each budget lets one pod go and refuses the next until the timeout.
        drain = subprocess.run(
            [
                "kubectl",
                "drain",
                NODE,
                "--pod-selector=app.kubernetes.io/part-of=pin",
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=45s",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert drain.returncode != 0, "the drain evicted every pod: no budget held"
        assert "disruption budget" in drain.stderr + drain.stdout, drain.stderr
        for (release, component), count in replicas.items():
            assert ready_count(release, component) >= count - 1, (release, component)
    finally:
        kubectl("uncordon", NODE)
    wait_rolled_out(IDENTITY)
    wait_rolled_out(REWARDS)
