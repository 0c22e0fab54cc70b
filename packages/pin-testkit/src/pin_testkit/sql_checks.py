"""Checks of a service package's named SQL (``pin_runtime.sql``), the same for every service.

A package keeps its runtime statements in ``.sql`` files under ``-- name: x --`` headers
(migrations apart) and its Python modules hold no SQL strings. These functions find what
breaks that: a statement no module names (dead SQL, or a typo in a name), a module that
spells SQL, a file that does not ship with the package. Each returns what it found, so a
test asserts it is empty and the failure lists every offender.

`SqlFileChecks` runs all of them: a package's test module subclasses it as `TestSqlFiles`,
naming the package and the files it expects.
"""

from __future__ import annotations

import importlib
import re
from importlib.resources import files
from pathlib import Path
from typing import ClassVar, Final

from pin_runtime.sql import load_queries

__all__ = [
    "SqlFileChecks",
    "modules_with_sql",
    "not_shipped",
    "sql_files",
    "unused_statements",
]

_SQL_IN_PYTHON: Final = re.compile(r"""["'](\s*)(SELECT|INSERT|UPDATE|DELETE|COPY|LISTEN|WITH)\s""")


def _source(package: str) -> Path:
    module = importlib.import_module(package)
    if module.__file__ is None:
        raise ValueError(f"{package} has no source directory")
    return Path(module.__file__).parent


def sql_files(package: str) -> list[str]:
    """The package's statement files, as ``<dir>/<name>.sql`` paths inside it (not migrations)."""
    source = _source(package)
    return sorted(
        str(path.relative_to(source))
        for path in source.rglob("*.sql")
        if "migrations" not in path.relative_to(source).parts
    )


def unused_statements(package: str, filename: str) -> list[str]:
    """The statements of ``filename`` that no module of the package names (``.name`` or
    ``"name"``)."""
    source = _source(package)
    code = "\n".join(path.read_text() for path in source.rglob("*.py"))
    return [
        statement
        for statement in load_queries(package, filename)
        if not re.search(rf"""(\.|["']){statement}\b""", code)
    ]


def modules_with_sql(package: str) -> list[str]:
    """The modules of the package that spell a statement instead of loading it."""
    source = _source(package)
    return sorted(
        str(path.relative_to(source))
        for path in source.rglob("*.py")
        if _SQL_IN_PYTHON.search(path.read_text())
    )


def not_shipped(package: str) -> list[str]:
    """The statement files that the installed package does not hold."""
    return [
        filename
        for filename in sql_files(package)
        if not files(package).joinpath(*filename.split("/")).is_file()
    ]


class SqlFileChecks:
    """The checks every package with named SQL runs (pytest collects a `Test*` subclass).

    `PACKAGE` is the import name, `EXPECTED` its statement files (``sql_files`` order): a
    file added or removed is a decision its tests name. Each failure lists every offender
    (this module is not rewritten by pytest, so the checks say it themselves)."""

    PACKAGE: ClassVar[str]
    EXPECTED: ClassVar[tuple[str, ...]]

    def test_the_sql_files_are_the_expected_ones(self) -> None:
        found = tuple(sql_files(self.PACKAGE))
        if found != self.EXPECTED:
            raise AssertionError(
                f"{self.PACKAGE}: statement files {found}, expected {self.EXPECTED}"
            )

    def test_every_statement_is_run_by_the_code(self) -> None:
        # A statement no module names is dead SQL (or a typo in a name): both fail here.
        unused = {name: unused_statements(self.PACKAGE, name) for name in self.EXPECTED}
        _none(self.PACKAGE, "statements no module runs", {n: f for n, f in unused.items() if f})

    def test_no_module_holds_sql(self) -> None:
        # Statements live in the .sql files; Python composes them, it does not spell them.
        _none(self.PACKAGE, "modules spelling SQL", modules_with_sql(self.PACKAGE))

    def test_the_sql_files_ship_with_the_package(self) -> None:
        _none(self.PACKAGE, "statement files not shipped", not_shipped(self.PACKAGE))


def _none(package: str, what: str, found: object) -> None:
    if found:
        raise AssertionError(f"{package}: {what}: {found}")
