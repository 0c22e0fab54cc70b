"""set-role-permissions: the enqueue side of the fan-out.

Replacing a role's permissions, bumping its Version and announcing the change happen in one
transaction: a committed permission change always has its events in the outbox (small
role) or its task in the queue (large role), never neither.

A small role's events are written as one page of the role from its first user, by the
statement the worker's batches write theirs with (`page.write_page`): one builder of the
event, its headers and key, whichever path a change takes.

The same transaction supersedes the role's older unfinished tasks: the new version's
snapshot reaches every user they had not reached yet, so they stop where they are instead
of walking the role beside the new task, and each user receives the role's versions in
order. A batch of an older task in flight commits first (the supersede waits for its row
lock); its next batch finds the task finished and stops.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Literal
from uuid import UUID

import msgspec
from psycopg import Connection
from psycopg.rows import TupleRow, class_row

from identity_fanout.errors import RoleArchivedError, RoleNotFoundError, UnknownPermissionError
from identity_fanout.fanout.assignments import count_users_up_to
from identity_fanout.fanout.page import PageOf, write_page
from identity_fanout.fanout.queue import enqueue_task, supersede_older_tasks
from identity_fanout.outbox.writer import current_trace_context
from pin_runtime.sql import columns, load_queries

_roles = load_queries("identity_fanout", "fanout/sql/roles.sql")


class PermissionsChange(msgspec.Struct, frozen=True, kw_only=True):
    """What set_role_permissions did (or, with `dry_run`, would do)."""

    role_id: UUID
    version: int
    mode: Literal["unchanged", "inline", "queued"]
    users: int | None
    """Users notified inline; queued: None from set_role_permissions (the worker counts
    them), the role's users counted just after the change by the command
    (`ops.roles.change_permissions`)."""
    task_id: UUID | None
    superseded: tuple[UUID, ...] = ()
    """Older unfinished tasks of the role this change took over."""
    shards: int = 0
    """Queued: the shards the task splits into at the command's ShardSize (0: walked as one
    unit); the worker splits it by its own ShardSize and count at its first claim."""
    dry_run: bool = False
    """Nothing was written: the same statements ran and were rolled back."""


class RoleSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One row of identity.role_definitions, as `roles show` prints it."""

    id: UUID
    code: str
    company_id: UUID | None
    status: str
    version: int
    created_at: datetime
    updated_at: datetime


_ROLE_SUMMARY = _roles.compose("role_summary", columns=columns(RoleSummary))


def get_role(conn: Connection[TupleRow], role_id: UUID) -> RoleSummary:
    """The role; RoleNotFoundError if there is none."""
    with conn.cursor(row_factory=class_row(RoleSummary)) as cur:
        role = cur.execute(_ROLE_SUMMARY, {"id": role_id}).fetchone()
    if role is None:
        raise RoleNotFoundError(role_id)
    return role


def role_permissions(conn: Connection[TupleRow], role_id: UUID) -> list[str]:
    """The role's permission codes, sorted."""
    return sorted(row[0] for row in conn.execute(_roles.current_permissions, {"id": role_id}))


def set_role_permissions(
    conn: Connection[TupleRow],
    role_id: UUID,
    permission_codes: Iterable[str],
    *,
    inline_threshold: int,
    correlation_id: str | None = None,
) -> PermissionsChange:
    """Replace the role's permission set and fan the change out (inline or queued).

    An identical set changes nothing: no Version bump, no events. Raises
    RoleNotFoundError, RoleArchivedError or UnknownPermissionError before writing anything.
    """
    codes = sorted(set(permission_codes))
    correlation = correlation_id or str(uuid.uuid4())
    with conn.transaction():
        role = conn.execute(_roles.lock_role, {"id": role_id}).fetchone()
        if role is None:
            raise RoleNotFoundError(role_id)
        company_id, status, version = role
        if status != "Active":
            raise RoleArchivedError(role_id)
        unknown = [row[0] for row in conn.execute(_roles.unknown_permissions, {"codes": codes})]
        if unknown:
            raise UnknownPermissionError(unknown)
        current = sorted(
            row[0] for row in conn.execute(_roles.current_permissions, {"id": role_id})
        )
        if current == codes:
            return PermissionsChange(
                role_id=role_id, version=version, mode="unchanged", users=0, task_id=None
            )
        conn.execute(_roles.replace_permissions, {"id": role_id, "codes": codes})
        bumped = conn.execute(_roles.bump_version, {"id": role_id}).fetchone()
        if bumped is None:  # the row is locked above; a vanished role is a bug, not input
            raise RoleNotFoundError(role_id)
        new_version: int = bumped[0]
        superseded = tuple(supersede_older_tasks(conn, role_id, new_version))
        users = count_users_up_to(conn, role_id, inline_threshold + 1)
        if users <= inline_threshold:
            # The whole role as one page, bounded as the count above is.
            page = PageOf(
                role_id=role_id,
                role_company_id=company_id,
                version=new_version,
                after=None,
                upper=None,
                limit=inline_threshold + 1,
            )
            written = write_page(
                conn, page, correlation_id=correlation, trace_context=current_trace_context()
            )
            return PermissionsChange(
                role_id=role_id,
                version=new_version,
                mode="inline",
                users=written.users,
                task_id=None,
                superseded=superseded,
            )
        task_id = enqueue_task(conn, role_id, company_id, new_version)
    return PermissionsChange(
        role_id=role_id,
        version=new_version,
        mode="queued",
        users=None,
        task_id=task_id,
        superseded=superseded,
    )
