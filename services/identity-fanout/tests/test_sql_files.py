"""The named statements of identity-fanout: every file loads, every statement is used."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import pytest

import identity_fanout
from pin_runtime.sql import load_queries

SOURCE = Path(identity_fanout.__file__).parent
SQL_FILES = sorted(
    [f"sql/{p.name}" for p in SOURCE.joinpath("sql").glob("*.sql")]
    + [f"membership/{p.name}" for p in SOURCE.joinpath("membership").glob("*.sql")]
)


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
    package, _, name = filename.rpartition("/")
    queries = load_queries(
        "identity_fanout.membership" if package == "membership" else "identity_fanout",
        name if package == "membership" else filename,
    )
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


def test_the_sql_files_ship_with_the_package() -> None:
    for filename in SQL_FILES:
        assert files("identity_fanout").joinpath(*filename.split("/")).is_file()
