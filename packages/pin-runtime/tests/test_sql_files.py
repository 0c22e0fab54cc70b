"""The runtime's own named statements (migrations and runtime roles)."""

from __future__ import annotations

from pin_testkit.sql_checks import SqlFileChecks


class TestSqlFiles(SqlFileChecks):
    PACKAGE = "pin_runtime"
    EXPECTED = ("queries/migrations.sql", "queries/roles.sql")
