"""The grant-matrix check both services run: exact privileges, refused statements."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from pin_runtime.db_roles import RuntimeRole, TableGrant, apply_runtime_roles
from pin_testkit.runtime_roles import (
    assert_exact_privileges,
    ensure_login,
    privilege_mismatches,
    refused,
    runtime_dsn,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def role(fresh_database: str) -> Iterator[RuntimeRole]:
    """A runtime role of this test alone (roles are cluster-wide), dropped afterwards with
    its privileges in ``fresh_database``."""
    declared = RuntimeRole(
        name=f"pin_test_reader_{uuid.uuid4().hex[:8]}",
        purpose="reads the probe table in a test",
        grants=(TableGrant("probe", ("SELECT",)),),
    )
    yield declared
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        made = [
            sql.Identifier(name)
            for (name,) in conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)",
                ([f"{declared.name}_login", declared.name, declared.holder_named("")],),
            )
        ]
        if made:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.SQL(", ").join(made)))
            for name in made:
                conn.execute(sql.SQL("DROP ROLE {}").format(name))


def test_declared_privileges_match_and_extra_ones_are_listed(
    fresh_database: str, postgres_admin_dsn: str, role: RuntimeRole
) -> None:
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA app")
        conn.execute("CREATE TABLE app.probe (x int)")
        conn.execute("CREATE TABLE app.other (x int)")
        with conn.transaction():
            apply_runtime_roles(conn, schema="app", roles=[role])
        assert (
            privilege_mismatches(conn, schema="app", tables=["probe", "other"], roles=[role]) == []
        )
        assert_exact_privileges(fresh_database, schema="app", tables=["probe"], roles=[role])

        conn.execute(sql.SQL("GRANT INSERT ON app.other TO {}").format(sql.Identifier(role.name)))
        conn.execute(
            sql.SQL("REVOKE SELECT ON app.probe FROM {}").format(
                sql.Identifier(role.holder_named(""))
            )
        )
        assert privilege_mismatches(
            conn, schema="app", tables=["probe", "other"], roles=[role]
        ) == [
            f"{role.name} lacks SELECT on app.probe",
            f"{role.name} holds INSERT on app.other",
        ]
    with pytest.raises(AssertionError, match=r"holds INSERT on app\.other"):
        assert_exact_privileges(fresh_database, schema="app", tables=["other"], roles=[role])

    ensure_login(postgres_admin_dsn, role.name)
    as_role = runtime_dsn(fresh_database, role.name)
    assert refused(as_role, "DELETE FROM app.probe") == "42501"
    with pytest.raises(AssertionError, match=r"not refused: INSERT INTO app\.other"):
        refused(as_role, "INSERT INTO app.other VALUES (1)")
