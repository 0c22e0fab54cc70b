"""What the fan-out reads of the role model: how many users a role has, where its shards
split, a page of its users and their snapshots (`sql/fanout.sql`).

The worker's batch reads the same page inside its one statement (`batch.WRITE_PAGE`
composes `page_users` in): one keyset rule for the inline path, the split and the batch.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from psycopg import Connection
from psycopg.rows import TupleRow, class_row

from identity_fanout.fanout.shards import END, START
from pin_runtime.sql import load_queries

__all__ = [
    "AssignmentRow",
    "count_users",
    "count_users_up_to",
    "page_users",
    "snapshot_rows",
    "split_bounds",
]

_fanout = load_queries("identity_fanout", "fanout/sql/fanout.sql")

Conn = Connection[TupleRow]


class AssignmentRow(NamedTuple):
    """A row of `snapshot_rows`, read by column name (class_row)."""

    user_id: UUID
    assignment_id: UUID
    role_id: UUID
    role_code: str
    company_id: UUID | None
    scope_type: str
    scope_organization_id: UUID | None
    scope_project_group_id: UUID | None
    scope_project_id: UUID | None
    expires_at: datetime | None
    """In UTC without a zone, null beyond what the wire carries (the query says why)."""


def count_users_up_to(conn: Conn, role_id: UUID, limit: int) -> int:
    """The role's distinct active users, counted up to ``limit`` at most."""
    row = conn.execute(_fanout.count_users_up_to, {"role_id": role_id, "limit": limit}).fetchone()
    return int(row[0]) if row else 0


def count_users(conn: Conn, role_id: UUID) -> int:
    """The role's distinct active users, all of them (a large role's split)."""
    row = conn.execute(_fanout.count_users, {"role_id": role_id}).fetchone()
    return int(row[0]) if row else 0


def split_bounds(conn: Conn, role_id: UUID, *, step: int, bounds: int) -> list[UUID]:
    """Every ``step``-th of the role's users in UserId order, ``bounds`` of them at most:
    the inner bounds of its shards."""
    params = {"role_id": role_id, "step": step, "bounds": bounds}
    return [row[0] for row in conn.execute(_fanout.split_bounds, params)]


def page_users(
    conn: Conn, role_id: UUID, after: UUID | None, limit: int, *, upper: UUID | None = None
) -> list[UUID]:
    """The next ``limit`` distinct users of the role's Active assignments after ``after``
    (up to ``upper`` inclusive: a shard's range)."""
    params = {"role_id": role_id, "after": after or START, "upper": upper or END, "limit": limit}
    return [row[0] for row in conn.execute(_fanout.page_users, params)]


def snapshot_rows(conn: Conn, user_ids: list[UUID]) -> list[AssignmentRow]:
    """Every Active, unexpired assignment of the users, by user then assignment: each
    user's snapshot, one query for the page."""
    if not user_ids:
        return []
    with conn.cursor(row_factory=class_row(AssignmentRow)) as cur:
        return cur.execute(_fanout.snapshot_rows, {"user_ids": user_ids}).fetchall()
