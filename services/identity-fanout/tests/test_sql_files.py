"""The named statements of identity-fanout: every file loads, every statement is used."""

from __future__ import annotations

import pytest

from pin_testkit.sql_checks import modules_with_sql, not_shipped, sql_files, unused_statements

PACKAGE = "identity_fanout"
SQL_FILES = sql_files(PACKAGE)


def test_the_sql_files_are_the_expected_ones() -> None:
    assert SQL_FILES == [
        "membership/membership.sql",
        "sql/channels.sql",
        "sql/fanout.sql",
        "sql/lanes.sql",
        "sql/outbox.sql",
        "sql/quarantine.sql",
        "sql/relay.sql",
        "sql/roles.sql",
        "sql/shards.sql",
        "sql/tasks.sql",
        "sql/units.sql",
    ]


@pytest.mark.parametrize("filename", SQL_FILES)
def test_every_statement_is_run_by_the_code(filename: str) -> None:
    # A statement no module names is dead SQL (or a typo in a name): both fail here.
    assert unused_statements(PACKAGE, filename) == []


def test_no_module_holds_sql() -> None:
    # Statements live in the .sql files; Python composes them, it does not spell them.
    assert modules_with_sql(PACKAGE) == []


def test_the_sql_files_ship_with_the_package() -> None:
    assert not_shipped(PACKAGE) == []
