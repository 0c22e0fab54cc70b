"""Scenario 12: a rolling upgrade from the previous tagged release, with work in flight.

The previous release of each service (the newest release its UPGRADING.md records below the
version in its pyproject.toml, by commit) is built from git history into a virtual
environment of its own, with the dependencies its own lockfile pins. The scenario's databases
are migrated to this release's schema first, as the chart's pre-upgrade hook does before any
pod rolls. The old worker, relay and consumer run a queued fan-out of a role, which the role's
next change supersedes midway, while membership changes keep arriving; then each is replaced
as the chart's rolling update replaces a pod (maxSurge 1, maxUnavailable 0: the new one
ready, then the old one stopped): the relay, the worker (mid-task), the consumer. The
relays send in small windows and the workers wait on a small outbox backlog, so the fan-out
goes at the relays' pace and every swap happens while it runs.

Nothing lost: every user has an event of the newer version, every membership change reached
the projection. Nothing applied twice: at most one event per user and version (no batch
fanned out again), the projection's row version equal to identity's (each change applied
once), one inbox mark per event. Per-key order: in the topics, a user's versions and an
agent's membership versions (per agency) never go down.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import pytest
from pin_e2e.checks import AccessDelivery, MembershipPlan, analyse_access, expected_snapshots
from pin_e2e.report import Recorder
from pin_e2e.steps import (
    BackgroundRecorder,
    RoleChange,
    change_role_permissions,
    inbox_count,
    seed_role,
    task_row,
)
from pin_e2e.system import (
    CONSUMER,
    IDENTITY_FANOUT,
    RELAY,
    REWARDS_MEMBERSHIP,
    WORKER,
    System,
)
from pin_e2e.verify import access_delivered, wait_checkpointed, wait_converged, wait_task_drained

from pin_contracts import decode_access_changed, decode_membership_changed
from pin_testkit.ports import free_port
from pin_testkit.records import Record
from pin_testkit.releases import ROOT, ServiceRelease, build_previous_release
from pin_testkit.service import ServiceProcess

pytestmark = pytest.mark.integration

USERS = 4_000
CODE = "s12-role"
AGENTS, AGENCIES, CHANGES = 200, 10, 600
PACE = 0.05  # seconds between membership changes: they keep arriving through every swap
# The fan-out is paced by the relays: the workers wait while this many rows wait in the
# outbox, and the relays send in small windows, so each swap happens mid-task.
BACKLOG = {"MAX_OUTBOX_BACKLOG": "100"}
SLOW_RELAY = {"RELAY_BATCH_SIZE": "5", "RELAY_WINDOW_RECORDS": "5"}


@dataclass(frozen=True)
class OldRelease:
    """The previous release of both services: their tags and their console scripts."""

    identity_tag: str
    rewards_tag: str
    identity: Path
    rewards: Path


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> OldRelease:
    (identity, identity_program), (rewards, rewards_program) = (
        build_previous_release(
            ServiceRelease.of(ROOT / "services" / service), tmp_path_factory.mktemp(service)
        )
        for service in (IDENTITY_FANOUT, REWARDS_MEMBERSHIP)
    )
    return OldRelease(identity.tag, rewards.tag, identity_program, rewards_program)


def installed_version(program: Path) -> str:
    """The version of the distribution ``program`` (a console script) belongs to, as its
    own environment has it installed."""
    done = subprocess.run(
        [
            program.with_name("python"),
            "-c",
            f"import importlib.metadata as m; print(m.version({program.name!r}))",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def change_role(system: System, role: UUID, *codes: str) -> RoleChange:
    """``roles set-permissions --json`` of this release, queued."""
    out = system.identity_cli("roles", "set-permissions", str(role), *codes, "--json").stdout
    change = json.loads(out)
    assert change["mode"] == "queued", change
    return RoleChange(UUID(change["role_id"]), change["version"], "queued", UUID(change["task_id"]))


def old_process(
    system: System, label: str, program: Path, args: list[str], env: Callable[..., dict[str, str]]
) -> ServiceProcess:
    port = free_port()
    return system.process(
        label, str(program), args, env(METRICS_HOST="127.0.0.1", METRICS_PORT=str(port)), port
    )


def version_went_down(
    records: list[Record], key: Callable[[bytes], tuple[object, int]]
) -> list[str]:
    """Keys whose Version went down from one record to a later one of the same partition."""
    last: dict[object, int] = {}
    down: list[str] = []
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        assert record.value is not None
        owner, version = key(record.value)
        if version < last.get(owner, 0):
            down.append(f"{owner}: {last[owner]} then {version} at {record.offset}")
        last[owner] = max(version, last.get(owner, 0))
    return down


def access_key(value: bytes) -> tuple[object, int]:
    event = decode_access_changed(value).payload
    return event.user_id, event.version


def membership_key(value: bytes) -> tuple[object, int]:
    event = decode_membership_changed(value).payload
    return (event.agent_user_id, event.company_id), event.version


def start_old_release(system: System, old: OldRelease) -> list[ServiceProcess]:
    """The previous release's worker, relay and consumer on the new schema, ready."""
    processes = [
        old_process(
            system,
            "worker-old",
            old.identity,
            ["worker", "--no-relay"],
            lambda **s: system.identity_env(WORKER, **BACKLOG, **s),
        ),
        old_process(
            system,
            "relay-old",
            old.identity,
            ["relay"],
            lambda **s: system.identity_env(RELAY, **SLOW_RELAY, **s),
        ),
        old_process(
            system,
            "consumer-old",
            old.rewards,
            ["consume"],
            lambda **s: system.rewards_env(CONSUMER, **s),
        ),
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.wait_ready()
    return processes


def access_in_order(
    system: System, users: list[UUID], older: int, newer: int
) -> tuple[AccessDelivery, AccessDelivery]:
    """Both versions' events checked: every user has the newer one (nothing lost), the
    older one reached some before it was superseded, at most one event per user and version
    (nothing fanned out twice), and per user the versions never go down in the topic."""
    latest = access_delivered(system, users, newer)
    earlier = analyse_access(
        system.access_records(),
        users=expected_snapshots(system.identity_dsn, users),
        version=older,
    )
    assert (earlier.wrong_snapshots, earlier.wrong_fields) == ([], [])
    assert earlier.delivered > 0, "the older version reached nobody before it was superseded"
    assert latest.fanout_duplicates == earlier.fanout_duplicates == 0
    assert version_went_down(system.access_records(), access_key) == []
    return latest, earlier


def test_rolling_upgrade_from_the_previous_release(
    make_system: Callable[[str], System], recorder: Recorder, old_release: OldRelease
) -> None:
    with recorder.scenario(
        12, "rolling upgrade from the previous release, work in flight"
    ) as stats:
        system = make_system("s12")
        for program, tag in (
            (old_release.identity, old_release.identity_tag),
            (old_release.rewards, old_release.rewards_tag),
        ):
            assert installed_version(program) == tag.rsplit("-v", 1)[1]
        role, users = seed_role(system, users=USERS, code=CODE)
        plan = MembershipPlan.random(agents=AGENTS, agencies=AGENCIES, changes=CHANGES, seed=12)

        old_worker, old_relay, old_consumer = start_old_release(system, old_release)
        stats.mark(f"{old_release.identity_tag}, {old_release.rewards_tag} ready")

        changes = BackgroundRecorder(system, plan.changes, PACE).start()
        first = change_role_permissions(system, role, CODE)
        assert first.mode == "queued"
        assert first.task is not None
        everyone = [old_worker, old_relay, old_consumer]
        wait_checkpointed(system, first.task, USERS // 10, alive=everyone)
        # The role changes again while its fan-out runs: the newer version takes over the
        # users the older task has not reached, so some users get both versions, in order.
        second = change_role(system, role, f"{CODE}.read")
        assert second.task is not None
        wait_checkpointed(system, second.task, USERS // 10, alive=everyone)

        # The new relay and worker ready beside the old ones (the new worker idle: the old
        # one holds the task's claim), then the old relay stopped, then the old worker,
        # mid-task: the new worker claims the task and continues it.
        new_relay = system.relay("relay-new", **SLOW_RELAY).start()
        new_worker = system.worker("worker-new", "--no-relay", **BACKLOG).start()
        for process in (new_relay, new_worker):
            process.wait_ready()
        assert old_relay.terminate() == 0
        at_relay = task_row(system, second.task)["processed_count"]
        stats.fault(f"relay replaced at {at_relay}/{USERS} users")
        at_worker = task_row(system, second.task)["processed_count"]
        assert old_worker.terminate() == 0
        assert at_worker < USERS, "the worker must be replaced mid-task"
        stats.fault(f"worker replaced at {at_worker}/{USERS} users")

        # The consumer, with membership changes still arriving.
        new_consumer = system.consumer("consumer-new").start()
        new_consumer.wait_ready()
        assert old_consumer.terminate() == 0
        assert changes.recorded < CHANGES, "the consumer must be replaced with changes arriving"
        stats.fault(f"consumer replaced after {changes.recorded}/{CHANGES} membership changes")
        new = [new_worker, new_relay, new_consumer]

        assert changes.join() == CHANGES
        for task in (first.task, second.task):
            wait_task_drained(system, task, what="both tasks done, the outbox drained", alive=new)
        wait_converged(system, plan, alive=new)
        stats.mark("converged")

        newer, older = access_in_order(system, users, first.version, second.version)
        # Every change applied once (wait_converged: each row's version equals identity's),
        # one idempotency mark per event, per-membership order in the topic.
        assert inbox_count(system) == CHANGES
        assert version_went_down(system.membership_records(), membership_key) == []

        stats.events = newer.distinct_events + older.distinct_events + CHANGES
        stats.lost = len(newer.lost)
        stats.duplicate("access redelivered", newer.relay_redeliveries + older.relay_redeliveries)
        stats.notes.append(
            f"{older.delivered} users got version {first.version} before version "
            f"{second.version} superseded it; all {USERS} got {second.version}"
        )
        for process in new:
            assert process.terminate() == 0
