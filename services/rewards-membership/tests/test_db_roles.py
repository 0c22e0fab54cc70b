"""Each runtime role may do what its process runs and nothing else (SQLSTATE 42501)."""

from __future__ import annotations

import psycopg
import pytest

from pin_testkit.runtime_roles import RUNTIME_GROUPS
from rewards_membership.db_roles import CONSUMER, OPERATOR, RUNTIME_ROLES

TABLES = ("agent_performance", "inbox", "dlq_replays", "schema_migrations")
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")


def refused(dsn: str, statement: str) -> str:
    """The SQLSTATE `statement` fails with when run by `dsn`'s user."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(statement.encode())
        except psycopg.errors.InsufficientPrivilege as exc:
            return str(exc.sqlstate)
    pytest.fail(f"not refused: {statement}")


@pytest.mark.integration
def test_the_database_holds_exactly_the_declared_privileges(database: str) -> None:
    with psycopg.connect(database) as db:
        for role in RUNTIME_ROLES:
            declared = {(g.table, p) for g in role.grants for p in g.privileges}
            for table in TABLES:
                for privilege in PRIVILEGES:
                    [(held,)] = db.execute(
                        "SELECT has_table_privilege(%s, %s, %s)",
                        (role.name, f"rewards.{table}", privilege),
                    ).fetchall()
                    assert held == ((table, privilege) in declared), (role.name, table, privilege)
            [(usage, create)] = db.execute(
                "SELECT has_schema_privilege(%(r)s, 'rewards', 'USAGE'), "
                "has_schema_privilege(%(r)s, 'rewards', 'CREATE')",
                {"r": role.name},
            ).fetchall()
            assert (usage, create) == (True, False), role.name


@pytest.mark.integration
def test_ddl_and_the_other_roles_statements_are_refused(
    consumer_dsn: str, operator_dsn: str
) -> None:
    assert refused(consumer_dsn, "DROP TABLE rewards.agent_performance") == "42501"
    assert refused(consumer_dsn, "CREATE TABLE rewards.mine (x int)") == "42501"
    assert refused(consumer_dsn, "DELETE FROM rewards.inbox") == "42501"
    assert refused(consumer_dsn, "SELECT * FROM rewards.dlq_replays") == "42501"
    assert refused(operator_dsn, "UPDATE rewards.agent_performance SET version = 0") == "42501"
    assert refused(operator_dsn, "TRUNCATE rewards.inbox") == "42501"
    assert refused(operator_dsn, "ALTER TABLE rewards.inbox ADD COLUMN x int") == "42501"
    for dsn in (consumer_dsn, operator_dsn):
        assert refused(dsn, "SELECT * FROM rewards.schema_migrations") == "42501"
        assert refused(dsn, "CREATE TABLE public.mine (x int)") == "42501"


def test_roles_of_pin_local_are_the_declared_ones() -> None:
    # pin-local and the end-to-end suite make one login user per name in this list.
    assert RUNTIME_GROUPS["pin_rewards"] == tuple(role.name for role in RUNTIME_ROLES)
    assert {CONSUMER, OPERATOR} == set(RUNTIME_ROLES)
