"""The named statements of rewards-membership: every file loads, every statement is used."""

from __future__ import annotations

from pathlib import Path

from pin_runtime.sql import load_queries
from pin_testkit.sql_checks import SqlFileChecks
from rewards_membership.rules.guard import MembershipRow


class TestSqlFiles(SqlFileChecks):
    PACKAGE = "rewards_membership"
    EXPECTED = (
        "sql/agent.sql",
        "sql/dead_letters.sql",
        "sql/inbox.sql",
        "sql/projection.sql",
    )


def test_the_row_document_names_the_row_type_fields_in_order() -> None:
    # json_to_recordset reads a row document by these names, and the INSERT pairs them with
    # columns(MembershipRow) by position: both must be the row type's fields, in order.
    fragment = load_queries("rewards_membership", "sql/projection.sql").row_document
    names = tuple(part.split()[0] for part in fragment.split(","))
    assert names == MembershipRow.__struct_fields__


def test_the_wheel_includes_the_sql_files() -> None:
    # hatch ships every file under src/rewards_membership/ unless the build excludes it.
    pyproject = Path(__file__).parents[1].joinpath("pyproject.toml").read_text()
    assert "exclude" not in pyproject
