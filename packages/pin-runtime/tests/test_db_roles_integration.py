"""Runtime roles applied by migrate(): created, granted exactly, re-granted, refused clearly."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pin_runtime.db_roles import RuntimeRole, TableGrant, check_role_prefix
from pin_runtime.errors import MigrationError
from pin_runtime.migrations import migrate

MigrationsDir = Callable[[Mapping[str, str]], Path]  # the conftest fixture

pytestmark = pytest.mark.integration

FILES = {
    "0001_tasks.sql": """
        CREATE TABLE app.tasks (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text);
        CREATE TABLE app.audit (id bigint PRIMARY KEY);
    """,
}
WRITER = RuntimeRole(
    name="writer",
    purpose="test writer",
    grants=(TableGrant("tasks", ("SELECT", "INSERT", "UPDATE")),),
)
READER = RuntimeRole(
    name="reader", purpose="test reader", grants=(TableGrant("tasks", ("SELECT",)),)
)


@pytest.fixture
def migrate_app(migrations_dir: MigrationsDir, prefix: str) -> Callable[..., list[str]]:
    """`migrate_app(dsn, roles=(WRITER, READER))`: FILES migrated into schema `app`, the
    roles under this test's prefix; what `migrate` returns."""
    directory = migrations_dir(FILES)

    def run(dsn: str, roles: tuple[RuntimeRole, ...] = (WRITER, READER)) -> list[str]:
        return migrate(dsn, schema="app", migrations=directory, roles=roles, role_prefix=prefix)

    return run


@pytest.fixture
def prefix(fresh_database: str, postgres_admin_dsn: str) -> Iterator[str]:
    """A role prefix of this test alone; its roles are dropped afterwards."""
    chosen = f"t{uuid.uuid4().hex[:10]}_"
    yield chosen
    with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
        names = [
            str(r[0])
            for r in admin.execute(
                "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)", (chosen,)
            )
        ]
    if not names:
        return
    idents = sql.SQL(", ").join(sql.Identifier(n) for n in names)
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(idents))
    with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
        for name in names:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def privileges(dsn: str, role: str) -> dict[str, set[str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT table_name, privilege_type FROM information_schema.role_table_grants "
            "WHERE table_schema = 'app' AND grantee = %s",
            (role,),
        ).fetchall()
    found: dict[str, set[str]] = {}
    for table, privilege in rows:
        found.setdefault(str(table), set()).add(str(privilege))
    return found


def test_roles_are_created_nologin_and_granted_exactly(
    fresh_database: str, migrate_app: Callable[..., list[str]], prefix: str
) -> None:
    migrate_app(fresh_database)
    assert privileges(fresh_database, f"{prefix}writer") == {
        "tasks": {"SELECT", "INSERT", "UPDATE"}
    }
    assert privileges(fresh_database, f"{prefix}reader") == {"tasks": {"SELECT"}}
    with psycopg.connect(fresh_database) as conn:
        row = conn.execute(
            "SELECT rolcanlogin, has_schema_privilege(%(r)s, 'app', 'USAGE'), "
            "has_schema_privilege(%(r)s, 'app', 'CREATE'), shobj_description(oid, 'pg_authid') "
            "FROM pg_roles WHERE rolname = %(r)s",
            {"r": f"{prefix}writer"},
        ).fetchone()
    assert row == (False, True, False, "test writer")


def test_a_privilege_dropped_from_the_declaration_is_revoked_at_the_next_run(
    fresh_database: str, migrate_app: Callable[..., list[str]], prefix: str
) -> None:
    migrate_app(fresh_database, (WRITER,))
    narrower = RuntimeRole(
        name="writer",
        purpose="test writer",
        grants=(TableGrant("tasks", ("SELECT",)), TableGrant("audit", ("INSERT",))),
    )
    assert migrate_app(fresh_database, (narrower,)) == []
    assert privileges(fresh_database, f"{prefix}writer") == {
        "tasks": {"SELECT"},
        "audit": {"INSERT"},
    }


def test_runtime_login_is_refused_ddl_and_ungranted_tables(
    fresh_database: str, migrate_app: Callable[..., list[str]], prefix: str, postgres_admin_dsn: str
) -> None:
    migrate_app(fresh_database, (WRITER,))
    login = f"{prefix}writer_login"
    with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                sql.Identifier(login), sql.Identifier(f"{prefix}writer")
            )
        )
    with psycopg.connect(make_conninfo(fresh_database, user=login), autocommit=True) as conn:
        # The identity column's sequence needs no grant of its own.
        conn.execute("INSERT INTO app.tasks (note) VALUES ('x')")
        for statement in (
            "CREATE TABLE app.mine (x int)",
            "DELETE FROM app.tasks",
            "SELECT * FROM app.audit",
            "SELECT * FROM app.schema_migrations",
            "DROP TABLE app.tasks",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                conn.execute(statement)
            assert refused.value.sqlstate == "42501", statement


def test_a_user_without_createrole_is_told_which_roles_to_create(
    migrate_app: Callable[..., list[str]], prefix: str, postgres_admin_dsn: str
) -> None:
    owner = f"{prefix}owner"
    database = f"{prefix}db"
    with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(owner)))
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(owner)
            )
        )
    owner_dsn = make_conninfo(postgres_admin_dsn, dbname=database, user=owner)
    try:
        with pytest.raises(MigrationError) as refused:
            migrate_app(owner_dsn)
        message = str(refused.value)
        assert f"{prefix}writer, {prefix}reader do not exist" in message
        assert f"CREATE ROLE {prefix}writer NOLOGIN" in message
        assert "CREATEROLE" in message
        # Nothing half-done: the files committed, no role, no grant.
        with psycopg.connect(postgres_admin_dsn) as admin:
            assert admin.execute(
                "SELECT count(*) FROM pg_roles WHERE rolname IN (%s, %s)",
                (f"{prefix}writer", f"{prefix}reader"),
            ).fetchone() == (0,)
        # Once an administrator made them, the same user grants to them (it owns the tables).
        with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
            for name in ("writer", "reader"):
                admin.execute(
                    sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(prefix + name))
                )
        assert migrate_app(owner_dsn) == []
        assert privileges(owner_dsn, f"{prefix}reader") == {"tasks": {"SELECT"}}
    finally:
        with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )


@pytest.mark.parametrize("bad", ["Upper_", "has-dash_", "x" * 32, "1digit_"])
def test_a_bad_prefix_is_refused_before_the_database_is_touched(
    bad: str, migrations_dir: MigrationsDir
) -> None:
    with pytest.raises(ValueError, match="lower-case SQL identifier"):
        check_role_prefix(bad)
    with pytest.raises(ValueError, match="lower-case SQL identifier"):
        migrate(
            "postgresql://nowhere.invalid/x",
            schema="app",
            migrations=migrations_dir(FILES),
            roles=(WRITER,),
            role_prefix=bad,
        )
