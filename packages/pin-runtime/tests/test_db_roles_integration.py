"""Runtime roles applied by migrate(): created, granted exactly, re-granted, refused clearly."""

from __future__ import annotations

import threading
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
from pin_testkit.waiting import wait_until

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
    """What ``role`` itself was granted on the schema's tables (not through a membership)."""
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


def held(dsn: str, role: str) -> dict[str, set[str]]:
    """What ``role`` may do on the schema's tables, however it holds it."""
    found: dict[str, set[str]] = {}
    with psycopg.connect(dsn) as conn:
        for table in ("tasks", "audit"):
            for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE"):
                row = conn.execute(
                    "SELECT has_table_privilege(%s, %s, %s)", (role, f"app.{table}", privilege)
                ).fetchone()
                if row and row[0]:
                    found.setdefault(table, set()).add(privilege)
    return found


def test_roles_are_created_nologin_and_granted_exactly(
    fresh_database: str, migrate_app: Callable[..., list[str]], prefix: str
) -> None:
    migrate_app(fresh_database)
    assert privileges(fresh_database, f"{prefix}writer_acl") == {
        "tasks": {"SELECT", "INSERT", "UPDATE"}
    }
    assert privileges(fresh_database, f"{prefix}reader_acl") == {"tasks": {"SELECT"}}
    # The roles hold them through their `_acl` roles, nothing of their own.
    assert privileges(fresh_database, f"{prefix}writer") == {}
    assert held(fresh_database, f"{prefix}writer") == {"tasks": {"SELECT", "INSERT", "UPDATE"}}
    assert held(fresh_database, f"{prefix}reader") == {"tasks": {"SELECT"}}
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
    assert held(fresh_database, f"{prefix}writer") == {"tasks": {"SELECT"}, "audit": {"INSERT"}}


def test_what_an_older_release_migrate_revokes_is_not_what_the_roles_run_on(
    fresh_database: str, migrate_app: Callable[..., list[str]], prefix: str
) -> None:
    """An older release's `migrate` (0.1.0, before the `_acl` roles) on a newer schema:
    everything granted to the role itself revoked, its own declaration granted again."""
    migrate_app(fresh_database, (WRITER,))
    writer = sql.Identifier(f"{prefix}writer")
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        for statement in (
            "REVOKE ALL ON ALL TABLES IN SCHEMA app FROM {}",
            "REVOKE ALL ON ALL SEQUENCES IN SCHEMA app FROM {}",
            "REVOKE ALL ON SCHEMA app FROM {}",
            "GRANT USAGE ON SCHEMA app TO {}",
            "GRANT SELECT, DELETE ON app.audit TO {}",
        ):
            conn.execute(sql.SQL(statement).format(writer))
    assert held(fresh_database, f"{prefix}writer") == {
        "tasks": {"SELECT", "INSERT", "UPDATE"},
        "audit": {"SELECT", "DELETE"},
    }
    # Forward again: the older release's grants to the role itself are gone.
    assert migrate_app(fresh_database, (WRITER,)) == []
    assert privileges(fresh_database, f"{prefix}writer") == {}
    assert held(fresh_database, f"{prefix}writer") == {"tasks": {"SELECT", "INSERT", "UPDATE"}}


def _waiting_on_a_lock(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("granted", ["pg_read_all_stats", "writer_acl"])
def test_a_membership_another_migrate_grants_meanwhile_is_no_failure(
    granted: str,
    fresh_database: str,
    migrate_app: Callable[..., list[str]],
    prefix: str,
    postgres_admin_dsn: str,
) -> None:
    """Roles are cluster-wide: a migration of another database of the cluster may grant the
    same membership between this one's look and its grant. Its transaction commits first;
    this grant then finds the membership made, which is what it wanted."""
    role = f"{prefix}{granted}" if granted == "writer_acl" else granted
    stats_writer = RuntimeRole(
        name="writer", purpose="test writer", grants=WRITER.grants, reads_statistics=True
    )
    with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
        for name in (f"{prefix}writer", f"{prefix}writer_acl"):
            admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(name)))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            migrate_app(fresh_database, (stats_writer,))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    with psycopg.connect(postgres_admin_dsn) as other:
        other.execute(
            sql.SQL("GRANT {} TO {}").format(
                sql.Identifier(role), sql.Identifier(f"{prefix}writer")
            )
        )
        thread = threading.Thread(target=run)
        thread.start()
        wait_until(
            lambda: _waiting_on_a_lock(fresh_database),
            10,
            "migrate waiting for the other transaction's membership",
            interval=0.02,
        )
        other.commit()
    thread.join(30)
    assert errors == []
    assert held(fresh_database, f"{prefix}writer") == {"tasks": {"SELECT", "INSERT", "UPDATE"}}


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
        names = [f"{prefix}{n}" for n in ("writer", "writer_acl", "reader", "reader_acl")]
        assert f"{', '.join(names)} do not exist" in message
        assert f"CREATE ROLE {prefix}writer NOLOGIN" in message
        assert f"CREATE ROLE {prefix}writer_acl NOLOGIN ROLE {prefix}writer" in message
        assert "CREATEROLE" in message
        # Nothing half-done: the files committed, no role, no grant.
        with psycopg.connect(postgres_admin_dsn) as admin:
            assert admin.execute(
                "SELECT count(*) FROM pg_roles WHERE rolname = ANY(%s)", (names,)
            ).fetchone() == (0,)
        # Once an administrator ran what it names, the same user grants to them (it owns the
        # tables).
        statements = message.split("create them first (", 1)[1].split(") or migrate", 1)[0]
        with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
            for statement in statements.split("; "):
                admin.execute(statement.encode())
        assert migrate_app(owner_dsn) == []
        assert held(owner_dsn, f"{prefix}reader") == {"tasks": {"SELECT"}}
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
