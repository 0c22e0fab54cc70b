"""Each runtime role may do what its process runs and nothing else (SQLSTATE 42501)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow

from identity_fanout.db_roles import OPERATOR, PRODUCER, RELAY, RUNTIME_ROLES, WORKER
from pin_testkit.runtime_roles import RUNTIME_GROUPS, assert_exact_privileges, refused
from pin_testkit.service import run_cli, service_environment

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
TABLES = (
    "role_definitions",
    "permissions",
    "role_permissions",
    "role_assignments",
    "access_fanout_tasks",
    "access_fanout_shards",
    "outbox",
    "outbox_id_seq",
    "outbox_quarantine",
    "outbox_quarantine_discards",
    "agent_memberships",
    "schema_migrations",
)


def test_the_database_holds_exactly_the_declared_privileges(identity_dsn: str) -> None:
    assert_exact_privileges(identity_dsn, schema="identity", tables=TABLES, roles=RUNTIME_ROLES)


def test_ddl_and_other_processes_tables_are_refused(
    worker_dsn: str, relay_dsn: str, producer_dsn: str, operator_dsn: str
) -> None:
    assert refused(relay_dsn, "CREATE TABLE identity.mine (x int)") == "42501"
    assert refused(relay_dsn, "UPDATE identity.access_fanout_tasks SET reason = 'x'") == "42501"
    assert refused(relay_dsn, "SELECT * FROM identity.role_assignments") == "42501"
    assert refused(worker_dsn, "DELETE FROM identity.outbox") == "42501"
    assert refused(worker_dsn, "SELECT * FROM identity.outbox") == "42501"
    assert refused(worker_dsn, "DROP TABLE identity.outbox") == "42501"
    assert refused(worker_dsn, "INSERT INTO identity.role_assignments (id) VALUES (NULL)") == (
        "42501"
    )
    assert refused(producer_dsn, "UPDATE identity.access_fanout_tasks SET reason = 'x'") == (
        "42501"
    )
    assert refused(producer_dsn, "SELECT * FROM identity.outbox_quarantine") == "42501"
    assert refused(operator_dsn, "TRUNCATE identity.outbox") == "42501"
    assert refused(operator_dsn, "ALTER TABLE identity.outbox ADD COLUMN x int") == "42501"
    assert refused(operator_dsn, "DELETE FROM identity.agent_memberships") == "42501"
    # The discards' audit is append-only for the operator: never read, changed or removed.
    for statement in (
        "SELECT * FROM identity.outbox_quarantine_discards",
        "UPDATE identity.outbox_quarantine_discards SET reason = 'x'",
        "DELETE FROM identity.outbox_quarantine_discards",
    ):
        assert refused(operator_dsn, statement) == "42501", statement
    for dsn in (worker_dsn, relay_dsn, producer_dsn, operator_dsn):
        assert refused(dsn, "SELECT * FROM identity.schema_migrations") == "42501"
        assert refused(dsn, "CREATE TABLE public.mine (x int)") == "42501"


def test_the_rewards_consumer_cannot_read_the_outbox(
    identity_dsn: str, runtime_dsn: Callable[[str, str], str]
) -> None:
    # Roles are cluster-wide: another service's runtime role reaching this database (same
    # server) finds no privilege here.
    for group in RUNTIME_GROUPS["pin_rewards"]:
        other = runtime_dsn(identity_dsn, group)
        assert refused(other, "SELECT * FROM identity.outbox") == "42501"
        assert refused(other, "SELECT * FROM identity.role_assignments") == "42501"


def test_roles_of_pin_local_are_the_declared_ones() -> None:
    # pin-local and the end-to-end suite make one login user per name in this list.
    assert RUNTIME_GROUPS["pin_identity"] == tuple(role.name for role in RUNTIME_ROLES)
    assert {WORKER, RELAY, PRODUCER, OPERATOR} == set(RUNTIME_ROLES)


def test_a_bad_role_prefix_is_a_config_error() -> None:
    env = service_environment(
        ("IDENTITY_FANOUT_",),
        IDENTITY_FANOUT_DATABASE_DSN="dbname=x",
        IDENTITY_FANOUT_DB_ROLE_PREFIX="Prod-",
    )
    result = run_cli("identity-fanout", ["migrate"], env, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("config error: IDENTITY_FANOUT_DB_ROLE_PREFIX:")


def test_migrate_without_createrole_names_the_roles_to_create(postgres_admin_dsn: str) -> None:
    """An owner that may not create roles: one line naming them and the statements that make
    them, exit 1; once an administrator ran those, the same owner grants to them."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    owner, database = f"{prefix}owner", f"{prefix}identity"
    roles = [prefix + role.name for role in RUNTIME_ROLES]
    with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(owner)))
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(owner)
            )
        )
    env = service_environment(
        ("IDENTITY_FANOUT_",),
        IDENTITY_FANOUT_DATABASE_DSN=make_conninfo(postgres_admin_dsn, dbname=database, user=owner),
        IDENTITY_FANOUT_DB_ROLE_PREFIX=prefix,
    )
    try:
        refused = run_cli("identity-fanout", ["migrate"], env, timeout=60, check=False)
        assert refused.returncode == 1, refused.stderr
        # The failure's one line comes last; the command's JSON log lines (stderr, too: its
        # stdout is only ever its result) come before it.
        *logged, line = refused.stderr.strip().splitlines()
        assert all(entry.startswith("{") for entry in logged), logged
        assert line.startswith("error: database role(s) ")
        assert ", ".join(f"{role}, {role}_acl" for role in roles) in line
        assert f"CREATE ROLE {prefix}identity_fanout_worker NOLOGIN" in line
        assert (
            f"CREATE ROLE {prefix}identity_fanout_worker_acl NOLOGIN "
            f"ROLE {prefix}identity_fanout_worker"
        ) in line
        # What an administrator runs: the statements the line names.
        statements = line.split("create them first (", 1)[1].split(") or migrate", 1)[0]
        with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
            for statement in statements.split("; "):
                admin.execute(statement.encode())
        granted = run_cli("identity-fanout", ["migrate"], env, timeout=60, check=False)
        assert granted.returncode == 0, granted.stderr
        with psycopg.connect(make_conninfo(postgres_admin_dsn, dbname=database)) as conn:
            [(held,)] = conn.execute(
                "SELECT has_table_privilege(%s, 'identity.outbox', 'DELETE')",
                (f"{prefix}identity_fanout_relay",),
            ).fetchall()
        assert held
    finally:
        with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )
            for role in [*roles, *(f"{role}_acl" for role in roles), owner]:
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
