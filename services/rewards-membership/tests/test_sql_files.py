"""The named statements of rewards-membership: every file loads, every statement is used."""

from __future__ import annotations

from pathlib import Path

import pytest

from pin_runtime.sql import load_queries
from pin_testkit.sql_checks import modules_with_sql, not_shipped, sql_files, unused_statements
from rewards_membership.guard import MembershipRow

PACKAGE = "rewards_membership"
SQL_FILES = sql_files(PACKAGE)


def test_the_sql_files_are_the_expected_ones() -> None:
    assert SQL_FILES == [
        "sql/agent.sql",
        "sql/dead_letters.sql",
        "sql/inbox.sql",
        "sql/projection.sql",
    ]


@pytest.mark.parametrize("filename", SQL_FILES)
def test_every_statement_is_run_by_the_code(filename: str) -> None:
    # A statement no module names is dead SQL (or a typo in a name): both fail here.
    assert unused_statements(PACKAGE, filename) == []


def test_no_module_holds_sql() -> None:
    # Statements live in the .sql files; Python composes them, it does not spell them.
    assert modules_with_sql(PACKAGE) == []


def test_the_row_document_names_the_row_type_fields_in_order() -> None:
    # json_to_recordset reads a row document by these names, and the INSERT pairs them with
    # columns(MembershipRow) by position: both must be the row type's fields, in order.
    fragment = load_queries("rewards_membership", "sql/projection.sql").row_document
    names = tuple(part.split()[0] for part in fragment.split(","))
    assert names == MembershipRow.__struct_fields__


def test_the_sql_files_ship_with_the_package() -> None:
    assert not_shipped(PACKAGE) == []


def test_the_wheel_includes_the_sql_files() -> None:
    # hatch ships every file under src/rewards_membership/ unless the build excludes it.
    pyproject = Path(__file__).parents[1].joinpath("pyproject.toml").read_text()
    assert "exclude" not in pyproject
