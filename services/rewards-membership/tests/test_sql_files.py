"""The named statements of rewards-membership: every file loads, every statement is used."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import pytest

import rewards_membership
from pin_runtime.sql import load_queries
from rewards_membership.guard import MembershipRow

SOURCE = Path(rewards_membership.__file__).parent
SQL_FILES = sorted(f"sql/{p.name}" for p in SOURCE.joinpath("sql").glob("*.sql"))


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
    queries = load_queries("rewards_membership", filename)
    code = "\n".join(p.read_text() for p in SOURCE.rglob("*.py"))
    for statement in queries:
        assert re.search(rf"""(\.|["']){statement}\b""", code), f"{filename}: {statement} unused"


def test_no_module_holds_sql() -> None:
    # Statements live in the .sql files; Python composes them, it does not spell them.
    keywords = re.compile(r"""["'](\s*)(SELECT|INSERT|UPDATE|DELETE|COPY|LISTEN|WITH)\s""")
    offenders = [
        str(p.relative_to(SOURCE)) for p in SOURCE.rglob("*.py") if keywords.search(p.read_text())
    ]
    assert offenders == []


def test_the_row_document_names_the_row_type_fields_in_order() -> None:
    # json_to_recordset reads a row document by these names, and the INSERT pairs them with
    # columns(MembershipRow) by position: both must be the row type's fields, in order.
    fragment = load_queries("rewards_membership", "sql/projection.sql").row_document
    names = tuple(part.split()[0] for part in fragment.split(","))
    assert names == MembershipRow.__struct_fields__


def test_the_sql_files_ship_with_the_package() -> None:
    for filename in SQL_FILES:
        assert files("rewards_membership").joinpath(*filename.split("/")).is_file()


def test_the_wheel_includes_the_sql_files() -> None:
    # hatch ships every file under src/rewards_membership/ unless the build excludes it.
    pyproject = SOURCE.parents[1].joinpath("pyproject.toml").read_text()
    assert "exclude" not in pyproject
