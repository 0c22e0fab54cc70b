"""The identity schema: migrations, constraints and the plans of the hot queries."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.rows import TupleRow

from identity_fanout.fanout.page import WRITE_PAGE, PageOf, page_parameters
from identity_fanout.fanout.shards import END
from identity_fanout.schema import migrate_database
from pin_runtime.sql import load_queries
from pin_testkit.seeding import seed_role_with_users

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
_fanout = load_queries("identity_fanout", "fanout/sql/fanout.sql")


def test_migrate_twice_is_a_no_op(fresh_database: str) -> None:
    assert migrate_database(fresh_database) != []
    assert migrate_database(fresh_database) == []


def test_spec_indexes_exist(db: Conn) -> None:
    names = {
        row[0]
        for row in db.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'identity' "
            "AND tablename = 'access_fanout_tasks'"
        )
    }
    assert {"ix_access_fanout_tasks_role_id", "ix_access_fanout_tasks_pending"} <= names


@pytest.mark.parametrize(
    ("column", "value"),
    [("role_version", 0), ("processed_count", -1), ("attempt_count", -1), ("status", "Done")],
)
def test_task_checks_refuse_bad_values(db: Conn, column: str, value: object) -> None:
    role, _ = seed_role_with_users(db, users=1, other_roles=0)
    values = {"role_version": 1, "processed_count": 0, "attempt_count": 0, "status": "Pending"}
    values[column] = value
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute(
            "INSERT INTO identity.access_fanout_tasks "
            "(id, role_id, role_version, reason, status, processed_count, attempt_count) "
            "VALUES (%s, %s, %s, 'RolePermissionsChanged', %s, %s, %s)",
            (
                uuid.uuid4(),
                role,
                values["role_version"],
                values["status"],
                values["processed_count"],
                values["attempt_count"],
            ),
        )


def test_role_with_tasks_cannot_be_deleted(db: Conn) -> None:
    role, _ = seed_role_with_users(db, users=1, other_roles=0)
    db.execute("DELETE FROM identity.role_assignments WHERE role_id = %s", (role,))
    db.execute(
        "INSERT INTO identity.access_fanout_tasks (id, role_id, role_version, reason) "
        "VALUES (%s, %s, 1, 'RolePermissionsChanged')",
        (uuid.uuid4(), role),
    )
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        db.execute("DELETE FROM identity.role_definitions WHERE id = %s", (role,))


def _plan(db: Conn, sql: str, params: dict[str, object]) -> str:
    rows = db.execute(f"EXPLAIN (COSTS OFF) {sql}", params).fetchall()
    return "\n".join(row[0] for row in rows)


def test_the_page_and_its_snapshots_read_the_partial_indexes(db: Conn) -> None:
    # A page is a small slice of a large table (a 500-user page of a 50k-user role among
    # millions of assignments); with a smaller slice than that the plan would be the same.
    role, users = seed_role_with_users(db, users=20_000, other_roles=1)
    db.execute("VACUUM ANALYZE identity.role_assignments")

    page = _plan(
        db,
        _fanout.page_users,
        {"role_id": role, "after": users[100], "upper": END, "limit": 500},
    )
    # The page statement's snapshots: each page user's assignments, by the user index.
    written = PageOf(role, None, 1, users[100], None, 500)
    statement = _plan(
        db, WRITE_PAGE, page_parameters(written, correlation_id=None, trace_context={})
    )

    assert "Index Only Scan using ix_role_assignments_role_active_user" in page
    assert "Index Only Scan using ix_role_assignments_role_active_user" in statement
    assert "ix_role_assignments_user_active" in statement
