"""pin_testkit.sql_checks on a small package of its own: what each check finds."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pin_testkit.sql_checks import (
    SqlFileChecks,
    modules_with_sql,
    not_shipped,
    sql_files,
    unused_statements,
)

STATEMENTS = """\
-- name: claim --
UPDATE t SET n = n + 1

-- name: forgotten --
SELECT 1
"""


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"pkg_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    for folder in ("sql", "migrations", "sub"):
        (root / folder).mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sql" / "work.sql").write_text(STATEMENTS)
    (root / "sub" / "more.sql").write_text("-- name: claim --\nSELECT 2\n")
    (root / "migrations" / "0001.sql").write_text("CREATE TABLE t (n int);\n")
    (root / "uses.py").write_text("def run(conn, q):\n    conn.execute(q.claim)\n")
    (root / "spells.py").write_text('STATEMENT = "SELECT n FROM t"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_statement_files_exclude_migrations(package: str) -> None:
    assert sql_files(package) == ["sql/work.sql", "sub/more.sql"]
    assert not_shipped(package) == []


def test_a_statement_no_module_names_is_found(package: str) -> None:
    assert unused_statements(package, "sql/work.sql") == ["forgotten"]
    assert unused_statements(package, "sub/more.sql") == []


def test_a_module_that_spells_sql_is_found(package: str) -> None:
    assert modules_with_sql(package) == ["spells.py"]


def test_the_shared_checks_name_every_offender(package: str) -> None:
    class Checks(SqlFileChecks):
        PACKAGE = package
        EXPECTED = ("sql/work.sql",)

    checks = Checks()
    with pytest.raises(AssertionError, match=r"sql/work.sql', 'sub/more.sql'"):
        checks.test_the_sql_files_are_the_expected_ones()
    with pytest.raises(AssertionError, match=r"statements no module runs: .*'forgotten'"):
        checks.test_every_statement_is_run_by_the_code()
    with pytest.raises(AssertionError, match=r"modules spelling SQL: \['spells.py'\]"):
        checks.test_no_module_holds_sql()
    checks.test_the_sql_files_ship_with_the_package()
