"""What the fan-out reads of the role model on its own: how many users a role has and where
its shards split (`sql/fanout.sql`).

The page of a role's users and their snapshots are read by the page statement itself
(`page.WRITE_PAGE` composes `page_users` in): one keyset rule for the inline path, the
split and the batch.
"""

from __future__ import annotations

from uuid import UUID

from psycopg import Connection
from psycopg.rows import TupleRow

from pin_runtime.sql import load_queries

__all__ = ["count_users", "count_users_up_to", "split_bounds"]

_fanout = load_queries("identity_fanout", "fanout/sql/fanout.sql")

Conn = Connection[TupleRow]


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
