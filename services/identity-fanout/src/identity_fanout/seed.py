"""Synthetic role data for the demo, the benchmark and the tests.

Writes with COPY: the benchmark seeds 150,000 assignments, and row-by-row inserts would
time the seeding instead of the fan-out.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Final
from uuid import UUID

import msgspec
from psycopg import Connection
from psycopg.rows import TupleRow

from pin_contracts import ScopeType

_COPY_ASSIGNMENTS: Final = (
    "COPY identity.role_assignments (id, role_id, user_id, company_id, status, scope_type, "
    "scope_organization_id, scope_project_group_id, scope_project_id, expires_at) "
    "FROM STDIN (FORMAT BINARY)"
)
_ASSIGNMENT_TYPES: Final = [
    "uuid",
    "uuid",
    "uuid",
    "uuid",
    "text",
    "text",
    "uuid",
    "uuid",
    "uuid",
    "timestamptz",
]


class Assignment(msgspec.Struct, frozen=True, kw_only=True):
    role_id: UUID
    user_id: UUID
    company_id: UUID | None = None
    status: str = "Active"
    scope_type: str = ScopeType.COMPANY.value
    scope_organization_id: UUID | None = None
    scope_project_group_id: UUID | None = None
    scope_project_id: UUID | None = None
    expires_at: datetime | None = None
    id: UUID = msgspec.field(default_factory=uuid.uuid4)


def add_permissions(conn: Connection[TupleRow], codes: Iterable[str]) -> None:
    conn.execute(
        "INSERT INTO identity.permissions (code) SELECT unnest(%(codes)s::text[]) "
        "ON CONFLICT DO NOTHING",
        {"codes": list(codes)},
    )


def add_role(
    conn: Connection[TupleRow],
    code: str,
    *,
    company_id: UUID | None = None,
    permissions: Sequence[str] = (),
    status: str = "Active",
    role_id: UUID | None = None,
) -> UUID:
    """A role with ``permissions`` (added to the catalogue too); its id."""
    rid = role_id or uuid.uuid4()
    conn.execute(
        "INSERT INTO identity.role_definitions (id, company_id, code, status) "
        "VALUES (%s, %s, %s, %s)",
        (rid, company_id, code, status),
    )
    if permissions:
        add_permissions(conn, permissions)
        conn.execute(
            "INSERT INTO identity.role_permissions (role_id, permission_code) "
            "SELECT %s, unnest(%s::text[])",
            (rid, list(permissions)),
        )
    return rid


def add_assignments(conn: Connection[TupleRow], assignments: Iterable[Assignment]) -> int:
    count = 0
    with conn.cursor() as cur, cur.copy(_COPY_ASSIGNMENTS) as copy:
        copy.set_types(_ASSIGNMENT_TYPES)
        for a in assignments:
            copy.write_row(
                (
                    a.id,
                    a.role_id,
                    a.user_id,
                    a.company_id,
                    a.status,
                    a.scope_type,
                    a.scope_organization_id,
                    a.scope_project_group_id,
                    a.scope_project_id,
                    a.expires_at,
                )
            )
            count += 1
    return count


def seed_role_with_users(
    conn: Connection[TupleRow],
    *,
    users: int,
    company_id: UUID | None = None,
    other_roles: int = 2,
    code: str = "big-role",
) -> tuple[UUID, list[UUID]]:
    """A role held by ``users`` new users, each also holding ``other_roles`` other roles.

    Returns the role id and the user ids (sorted, as the fan-out walks them).
    """
    company = company_id or uuid.uuid4()
    role = add_role(conn, code, company_id=company, permissions=[f"{code}.read"])
    others = [
        add_role(conn, f"{code}-other-{i}", company_id=company, permissions=[f"{code}.other{i}"])
        for i in range(other_roles)
    ]
    user_ids = sorted(uuid.uuid4() for _ in range(users))

    def rows() -> Iterable[Assignment]:
        for user in user_ids:
            yield Assignment(role_id=role, user_id=user, company_id=company)
            for other in others:
                yield Assignment(
                    role_id=other,
                    user_id=user,
                    company_id=company,
                    scope_type=ScopeType.PROJECT.value,
                    scope_organization_id=company,
                    scope_project_id=uuid.uuid5(other, str(user)),
                )

    add_assignments(conn, rows())
    return role, user_ids
