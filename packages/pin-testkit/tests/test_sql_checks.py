"""pin_testkit.sql_checks on a small package of its own: what each check finds."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pin_testkit.sql_checks import modules_with_sql, not_shipped, sql_files, unused_statements

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
