"""set-role-permissions: the enqueue side of the fan-out.

Replacing a role's permissions, bumping its Version and announcing the change happen in one
transaction: a committed permission change always has its events in the outbox (small
role) or its task in the queue (large role), never neither.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Final, Literal
from uuid import UUID

import msgspec
from psycopg import Connection
from psycopg.rows import TupleRow

from identity_fanout import queries
from identity_fanout.errors import RoleArchivedError, RoleNotFoundError, UnknownPermissionError
from identity_fanout.fanout import page_users, snapshot_events, write_events
from pin_contracts import AccessChangeReason, FanOutTaskStatus

_LOCK_ROLE: Final = """
SELECT company_id, status, version FROM identity.role_definitions WHERE id = %(id)s FOR UPDATE
"""
_CURRENT_PERMISSIONS: Final = """
SELECT permission_code FROM identity.role_permissions WHERE role_id = %(id)s
"""
_UNKNOWN_PERMISSIONS: Final = """
SELECT code FROM unnest(%(codes)s::text[]) AS wanted(code)
WHERE NOT EXISTS (SELECT 1 FROM identity.permissions p WHERE p.code = wanted.code)
ORDER BY code
"""
_REPLACE_PERMISSIONS: Final = """
WITH removed AS (
    DELETE FROM identity.role_permissions
    WHERE role_id = %(id)s AND NOT permission_code = ANY(%(codes)s)
)
INSERT INTO identity.role_permissions (role_id, permission_code)
SELECT %(id)s, code FROM unnest(%(codes)s::text[]) AS wanted(code)
ON CONFLICT DO NOTHING
"""
_BUMP_VERSION: Final = """
UPDATE identity.role_definitions SET version = version + 1, updated_at = now()
WHERE id = %(id)s RETURNING version
"""
# Only "more than the threshold or not" matters, so the count stops at threshold + 1.
_COUNT_USERS_UP_TO: Final = """
SELECT count(*) FROM (
    SELECT DISTINCT user_id FROM identity.role_assignments
    WHERE role_id = %(id)s AND status = 'Active'
    LIMIT %(limit)s
) AS users
"""
_ENQUEUE: Final = """
INSERT INTO identity.access_fanout_tasks (id, role_id, company_id, role_version, reason, status)
VALUES (%(task_id)s, %(role_id)s, %(company_id)s, %(version)s, %(reason)s, %(status)s)
"""


class PermissionsChange(msgspec.Struct, frozen=True, kw_only=True):
    """What set_role_permissions did."""

    role_id: UUID
    version: int
    mode: Literal["unchanged", "inline", "queued"]
    users: int | None
    """Users notified inline; None when queued (the worker counts them)."""
    task_id: UUID | None


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
        role = conn.execute(_LOCK_ROLE, {"id": role_id}).fetchone()
        if role is None:
            raise RoleNotFoundError(role_id)
        company_id, status, version = role
        if status != "Active":
            raise RoleArchivedError(role_id)
        unknown = [row[0] for row in conn.execute(_UNKNOWN_PERMISSIONS, {"codes": codes})]
        if unknown:
            raise UnknownPermissionError(unknown)
        current = sorted(row[0] for row in conn.execute(_CURRENT_PERMISSIONS, {"id": role_id}))
        if current == codes:
            return PermissionsChange(
                role_id=role_id, version=version, mode="unchanged", users=0, task_id=None
            )
        conn.execute(_REPLACE_PERMISSIONS, {"id": role_id, "codes": codes})
        bumped = conn.execute(_BUMP_VERSION, {"id": role_id}).fetchone()
        if bumped is None:  # the row is locked above; a vanished role is a bug, not input
            raise RoleNotFoundError(role_id)
        new_version: int = bumped[0]
        counted = conn.execute(
            _COUNT_USERS_UP_TO, {"id": role_id, "limit": inline_threshold + 1}
        ).fetchone()
        users = counted[0] if counted else 0
        if users <= inline_threshold:
            user_ids = page_users(conn, role_id, None, inline_threshold + 1)
            events = snapshot_events(
                conn, user_ids, role_id=role_id, role_company_id=company_id, version=new_version
            )
            write_events(conn, events, correlation_id=correlation)
            return PermissionsChange(
                role_id=role_id, version=new_version, mode="inline", users=len(events), task_id=None
            )
        task_id = uuid.uuid4()
        conn.execute(
            _ENQUEUE,
            {
                "task_id": task_id,
                "role_id": role_id,
                "company_id": company_id,
                "version": new_version,
                "reason": AccessChangeReason.ROLE_PERMISSIONS_CHANGED.value,
                "status": FanOutTaskStatus.PENDING.value,
            },
        )
        conn.execute(queries.NOTIFY_TASKS, {"task_id": task_id})
    return PermissionsChange(
        role_id=role_id, version=new_version, mode="queued", users=None, task_id=task_id
    )
