"""Each runtime role may do what its process runs and nothing else (SQLSTATE 42501)."""

from __future__ import annotations

import pytest

from pin_testkit.runtime_roles import RUNTIME_GROUPS, assert_exact_privileges, refused
from rewards_membership.db_roles import CONSUMER, OPERATOR, RUNTIME_ROLES

TABLES = ("agent_performance", "inbox", "dlq_replays", "dlq_resolutions", "schema_migrations")


@pytest.mark.integration
def test_the_database_holds_exactly_the_declared_privileges(database: str) -> None:
    assert_exact_privileges(database, schema="rewards", tables=TABLES, roles=RUNTIME_ROLES)


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
