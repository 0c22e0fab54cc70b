"""What the scenarios on the cluster share: the releases' names, the platform's addresses,
kubectl and helm, the ops pods' commands, and the checks of pin_e2e on these databases.

Every call runs inside the cluster's network namespace (``infra/kube/e2e.sh`` starts pytest
there), with ``KUBECONFIG`` set: PostgreSQL, Kafka and the API server are reached as a pod
reaches them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from uuid import UUID

import psycopg
from pin_e2e.checks import (
    AccessDelivery,
    PlannedChange,
    analyse_access,
    expected_snapshots,
    identity_memberships,
    membership_differences,
    rewards_rows,
)
from pin_e2e.steps import record_change

from pin_contracts import AGENT_MEMBERSHIP_CHANGED, USER_ACCESS_CHANGED
from pin_testkit.records import end_offsets, read_topic
from pin_testkit.seeding import add_permissions, seed_role_with_users
from pin_testkit.waiting import wait_until

ROOT: Final = Path(__file__).resolve().parents[1]
NAMESPACE: Final = "pin"
IDENTITY: Final = "identity-fanout"
REWARDS: Final = "rewards-membership"
NODE: Final = "pin-node"
POSTGRES: Final = "198.18.0.1:5432"
KAFKA: Final = "198.18.0.1:9092"
IDENTITY_DSN: Final = f"postgresql://pin:pin@{POSTGRES}/pin_identity"
REWARDS_DSN: Final = f"postgresql://pin:pin@{POSTGRES}/pin_rewards"
REVISION: Final = os.environ.get("PIN_KUBE_REVISION", "")
HELM: Final = os.environ.get("PIN_KUBE_HELM", "helm")


def run(args: Sequence[str], *, timeout: float = 300.0, check: bool = True) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)}: exit {done.returncode}\n{done.stderr}{done.stdout}"
        )
    return done.stdout


def kubectl(*args: str, timeout: float = 300.0, check: bool = True) -> str:
    return run(["kubectl", "-n", NAMESPACE, *args], timeout=timeout, check=check)


def helm(*args: str, timeout: float = 600.0) -> str:
    return run([HELM, "-n", NAMESPACE, *args], timeout=timeout)


def ops(release: str, *args: str) -> str:
    """A runbook command in the release's ops pod, as an operator types it."""
    return kubectl("exec", f"deploy/{release}-ops", "--", release, *args)


def install(release: str, *extra: str) -> None:
    """`helm upgrade --install` of the chart of this checkout with the cluster's values."""
    chart = ROOT / "infra" / "helm" / release
    values = ROOT / "infra" / "kube" / "values" / f"{release}.yaml"
    helm(
        "upgrade",
        "--install",
        release,
        str(chart),
        "-f",
        str(values),
        "--set",
        f"image.tag={REVISION}",
        "--wait",
        "--timeout",
        "5m",
        *extra,
    )


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    component: str
    ready: bool
    deleting: bool
    restarts: int


def pods(release: str, component: str | None = None) -> list[Pod]:
    selector = f"app.kubernetes.io/instance={release}"
    if component is not None:
        selector += f",app.kubernetes.io/component={component}"
    found: dict[str, Any] = json.loads(kubectl("get", "pods", "-l", selector, "-o", "json"))
    result = []
    for item in found["items"]:
        status = item["status"]
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        result.append(
            Pod(
                name=item["metadata"]["name"],
                component=item["metadata"]["labels"].get("app.kubernetes.io/component", ""),
                ready=conditions.get("Ready") == "True",
                deleting="deletionTimestamp" in item["metadata"],
                restarts=sum(c.get("restartCount", 0) for c in status.get("containerStatuses", [])),
            )
        )
    return result


def ready_count(release: str, component: str) -> int:
    return sum(1 for p in pods(release, component) if p.ready and not p.deleting)


def kill(pod: str) -> None:
    """What a node failure does to a pod: SIGKILL now, no grace, the object gone."""
    kubectl("delete", "pod", pod, "--grace-period=0", "--force", "--wait=false")


def wait_rolled_out(release: str, timeout: float = 300.0) -> None:
    for deployment in json.loads(
        kubectl("get", "deploy", "-l", f"app.kubernetes.io/instance={release}", "-o", "json")
    )["items"]:
        kubectl(
            "rollout",
            "status",
            f"deploy/{deployment['metadata']['name']}",
            f"--timeout={int(timeout)}s",
            timeout=timeout + 10,
        )


# -- identity ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FanOut:
    role: UUID
    users: list[UUID]
    version: int
    task: UUID | None
    start: dict[int, int]


def seed_role(users: int) -> tuple[UUID, list[UUID], str]:
    code = f"kube-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(IDENTITY_DSN) as conn:
        role, user_ids = seed_role_with_users(conn, users=users, other_roles=1, code=code)
        add_permissions(conn, [f"{code}.read", f"{code}.write"])
    return role, user_ids, code


def start_fanout(users: int) -> FanOut:
    """A role held by ``users`` users gets a new permission set through the ops pod's CLI
    (whichever release runs there: the version and the task are read back from identity)."""
    role, user_ids, code = seed_role(users)
    start = dict(end_offsets(KAFKA, USER_ACCESS_CHANGED.name))
    ops(IDENTITY, "roles", "set-permissions", str(role), f"{code}.read", f"{code}.write")
    with psycopg.connect(IDENTITY_DSN, autocommit=True) as conn:
        version = conn.execute(
            "SELECT version FROM identity.role_definitions WHERE id = %s", (role,)
        ).fetchone()
        task = conn.execute(
            "SELECT id FROM identity.access_fanout_tasks WHERE role_id = %s", (role,)
        ).fetchone()
    assert version is not None
    return FanOut(role, user_ids, int(version[0]), task[0] if task else None, start)


def task_status(task: UUID) -> tuple[str, int]:
    with psycopg.connect(IDENTITY_DSN, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, processed_count FROM identity.access_fanout_tasks WHERE id = %s",
            (task,),
        ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def outbox_rows() -> int:
    with psycopg.connect(IDENTITY_DSN, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM identity.outbox").fetchone()
    assert row is not None
    return int(row[0])


def delivered(fanout: FanOut, timeout: float = 300.0) -> AccessDelivery:
    """Waits for the task to complete and the outbox to drain, then checks every user's event."""
    if fanout.task is not None:
        task = fanout.task
        wait_until(lambda: task_status(task)[0] == "Completed", timeout, f"task {task} Completed")
    wait_until(lambda: outbox_rows() == 0, timeout, "the outbox drained")
    records = read_topic(KAFKA, USER_ACCESS_CHANGED.name, fanout.start)
    return analyse_access(
        records, users=expected_snapshots(IDENTITY_DSN, fanout.users), version=fanout.version
    )


def assert_complete(delivery: AccessDelivery) -> None:
    assert not delivery.lost, f"{len(delivery.lost)} users without their event"
    assert not delivery.wrong_snapshots, f"{len(delivery.wrong_snapshots)} wrong snapshots"
    assert not delivery.wrong_fields, delivery.wrong_fields[:5]
    assert delivery.delivered == delivery.users


# -- memberships ---------------------------------------------------------------------------


def record(changes: Sequence[PlannedChange]) -> None:
    """Joins and leaves recorded in identity, one transaction each, as the identity API does."""
    with psycopg.connect(IDENTITY_DSN, autocommit=True) as conn:
        for change in changes:
            record_change(conn, change)


def differences(
    agents: Sequence[UUID], final: Mapping[tuple[UUID, UUID], tuple[bool, int]] | None = None
) -> list[str]:
    """Where the rewards projection of ``agents`` differs from identity (and from ``final``,
    a plan's end state); ``applied`` equal to identity's Version: each change applied once."""
    return membership_differences(
        final, identity_memberships(IDENTITY_DSN, agents), rewards_rows(REWARDS_DSN, agents)
    )


def inbox_count() -> int:
    with psycopg.connect(REWARDS_DSN, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM rewards.inbox").fetchone()
    assert row is not None
    return int(row[0])


def membership_offsets() -> dict[int, int]:
    return dict(end_offsets(KAFKA, AGENT_MEMBERSHIP_CHANGED.name))


def elapsed_since(started: float) -> float:
    return time.monotonic() - started
