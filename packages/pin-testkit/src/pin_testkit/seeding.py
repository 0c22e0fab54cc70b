"""Synthetic identity role data for the demo, the benchmarks and the tests.

Not part of any service: it writes straight into the `identity` tables as their owner.
Assignments go in with COPY: the benchmark seeds 150,000 of them, and row-by-row inserts
would time the seeding instead of the fan-out.
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
from pin_runtime.sql import columns, load_queries

__all__ = ["Assignment", "add_assignments", "add_permissions", "add_role", "seed_role_with_users"]

_q = load_queries("pin_testkit", "sql/seeding.sql")


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


_COPY_ASSIGNMENTS: Final = _q.compose("copy_assignments", columns=columns(Assignment))
# The binary COPY's types, by field (Assignment's order).
_ASSIGNMENT_TYPES: Final = {
    "role_id": "uuid",
    "user_id": "uuid",
    "company_id": "uuid",
    "status": "text",
    "scope_type": "text",
    "scope_organization_id": "uuid",
    "scope_project_group_id": "uuid",
    "scope_project_id": "uuid",
    "expires_at": "timestamptz",
    "id": "uuid",
}


def add_permissions(conn: Connection[TupleRow], codes: Iterable[str]) -> None:
    conn.execute(_q.add_permissions, {"codes": list(codes)})


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
    conn.execute(_q.add_role, {"id": rid, "company_id": company_id, "code": code, "status": status})
    if permissions:
        add_permissions(conn, permissions)
        conn.execute(_q.add_role_permissions, {"role_id": rid, "codes": list(permissions)})
    return rid


def add_assignments(conn: Connection[TupleRow], assignments: Iterable[Assignment]) -> int:
    count = 0
    with conn.cursor() as cur, cur.copy(_COPY_ASSIGNMENTS) as copy:
        copy.set_types([_ASSIGNMENT_TYPES[name] for name in Assignment.__struct_fields__])
        for a in assignments:
            copy.write_row(msgspec.structs.astuple(a))
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
