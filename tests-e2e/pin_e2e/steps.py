"""Steps the scenarios share: seeding identity, changing a role, recording memberships."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import TupleRow

from identity_fanout.membership import join_agency, leave_agency
from pin_e2e.checks import (
    PlannedChange,
    identity_memberships,
    membership_differences,
    rewards_rows,
)
from pin_e2e.system import System
from pin_testkit.seeding import add_permissions, seed_role_with_users

__all__ = [
    "BackgroundRecorder",
    "RoleChange",
    "applied_total",
    "change_role_permissions",
    "inbox_count",
    "outbox_backlog",
    "projection_converged",
    "quarantined",
    "record_changes",
    "record_changes_cli",
    "seed_role",
    "task_row",
]


def seed_role(system: System, *, users: int, code: str) -> tuple[UUID, list[UUID]]:
    """A role held by ``users`` new users (each with two other roles), committed."""
    with psycopg.connect(system.identity_dsn) as conn:
        role, user_ids = seed_role_with_users(conn, users=users, other_roles=2, code=code)
        add_permissions(conn, [f"{code}.read", f"{code}.write"])
    return role, user_ids


@dataclass(frozen=True, slots=True)
class RoleChange:
    """What ``roles set-permissions --json`` printed: the new Version, inline or queued, the
    task."""

    role: UUID
    version: int
    mode: str
    task: UUID | None


def change_role_permissions(system: System, role: UUID, code: str) -> RoleChange:
    """``identity-fanout roles set-permissions`` as a script runs it (``--json``)."""
    out = system.identity_cli(
        "roles", "set-permissions", str(role), f"{code}.read", f"{code}.write", "--json"
    )
    change = json.loads(out.stdout)
    task = change["task_id"]
    return RoleChange(
        UUID(change["role_id"]), change["version"], change["mode"], UUID(task) if task else None
    )


def task_row(system: System, task: UUID) -> dict[str, Any]:
    with psycopg.connect(system.identity_dsn, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute("SELECT * FROM identity.access_fanout_tasks WHERE id = %s", (task,))
        row = cur.fetchone()
        assert row is not None
        assert cur.description is not None
        return {c.name: v for c, v in zip(cur.description, row, strict=True)}


def inbox_count(system: System) -> int:
    """Idempotency marks in rewards: one per applied or stale-skipped event."""
    with psycopg.connect(system.rewards_dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT count(*) FROM rewards.inbox").fetchone()
    assert row is not None
    return int(row[0])


def projection_converged(
    system: System,
    agents: Sequence[UUID],
    plan_final: Mapping[tuple[UUID, UUID], tuple[bool, int]] | None = None,
) -> Callable[[], bool]:
    """A condition: the rewards projection of ``agents`` equals identity (and the plan)."""

    def converged() -> bool:
        return not membership_differences(
            plan_final,
            identity_memberships(system.identity_dsn, agents),
            rewards_rows(system.rewards_dsn, agents),
        )

    return converged


def applied_total(metrics: Mapping[str, float]) -> int:
    """``rewards_membership_applied_total`` over both statuses."""
    prefix = "rewards_membership_applied_total{"
    return int(sum(v for k, v in metrics.items() if k.startswith(prefix)))


def outbox_backlog(system: System) -> int:
    with psycopg.connect(system.identity_dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT count(*) FROM identity.outbox").fetchone()
    assert row is not None
    return int(row[0])


def quarantined(system: System) -> list[tuple[str, str, str]]:
    """The outbox quarantine's rows: (topic, error code, error message) each."""
    with psycopg.connect(system.identity_dsn, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT topic, error_code, error_message FROM identity.outbox_quarantine ORDER BY id"
        ).fetchall()
    return [(str(t), str(c), str(m)) for t, c, m in rows]


def record_change(conn: psycopg.Connection[TupleRow], change: PlannedChange) -> None:
    """One planned join or leave, recorded as the identity API records it."""
    if change.join:
        join_agency(conn, change.agent, change.agency, invitation_id=change.invitation)
    else:
        assert change.reason is not None
        leave_agency(
            conn,
            change.agent,
            change.agency,
            reason=change.reason,
            effective_at=change.effective_at,
        )


def record_changes(system: System, changes: Sequence[PlannedChange]) -> int:
    """Record joins and leaves in identity, one transaction each, as the identity API does."""
    with psycopg.connect(system.identity_dsn, autocommit=True) as conn:
        for change in changes:
            record_change(conn, change)
    return len(changes)


def record_changes_cli(system: System, changes: Sequence[PlannedChange]) -> int:
    """The same through ``identity-fanout memberships join|leave``."""
    for change in changes:
        if change.join:
            args = ["memberships", "join", str(change.agent), str(change.agency)]
            if change.invitation is not None:
                args += ["--invitation", str(change.invitation)]
        else:
            assert change.reason is not None
            args = ["memberships", "leave", str(change.agent), str(change.agency)]
            args += ["--reason", change.reason.value]
            if change.effective_at is not None:
                args += ["--effective-at", change.effective_at.isoformat()]
        system.identity_cli(*args)
    return len(changes)


class BackgroundRecorder:
    """Records changes in a thread, paced, so that they keep arriving while a fault lasts.

    Only for faults that leave identity's database up: a change whose COMMIT was cut off by
    a database outage would have an unknown outcome.
    """

    def __init__(self, system: System, changes: Sequence[PlannedChange], pace: float) -> None:
        self._system = system
        self._changes = changes
        self._pace = pace
        self.recorded = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="e2e-recorder", daemon=True)

    def start(self) -> BackgroundRecorder:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            with psycopg.connect(self._system.identity_dsn, autocommit=True) as conn:
                for change in self._changes:
                    record_change(conn, change)
                    self.recorded += 1
                    time.sleep(self._pace)  # the shape of the load, not a wait for a condition
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self, timeout: float = 120.0) -> int:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the recorder thread did not finish"
        if self.error is not None:
            raise AssertionError(f"recording failed: {self.error!r}") from self.error
        return self.recorded
