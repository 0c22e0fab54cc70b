"""The named statements of rewards-membership: every file loads, every statement is used."""

from __future__ import annotations

from pathlib import Path

from pin_runtime.sql import load_queries
from pin_testkit.sql_checks import SqlFileChecks
from rewards_membership.batch_sql import BatchRecord


class TestSqlFiles(SqlFileChecks):
    PACKAGE = "rewards_membership"
    EXPECTED = (
        "sql/agent.sql",
        "sql/batch.sql",
        "sql/dead_letters.sql",
        "sql/inbox.sql",
        "sql/projection.sql",
    )


def test_the_record_document_names_the_batch_record_fields_in_order() -> None:
    # json_to_recordset reads the batch document by these names: they must be the fields
    # msgspec encodes a BatchRecord with, in order.
    fragment = load_queries("rewards_membership", "sql/batch.sql").record_document
    names = tuple(part.split()[0] for part in fragment.split(","))
    assert names == BatchRecord.__struct_fields__


def test_the_wheel_includes_the_sql_files() -> None:
    # hatch ships every file under src/rewards_membership/ unless the build excludes it.
    pyproject = Path(__file__).parents[1].joinpath("pyproject.toml").read_text()
    assert "exclude" not in pyproject
