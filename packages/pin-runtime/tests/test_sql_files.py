"""The runtime's own named statements (migrations, runtime roles, LISTEN/NOTIFY)."""

from __future__ import annotations

from pin_testkit.sql_checks import SqlFileChecks


class TestSqlFiles(SqlFileChecks):
    PACKAGE = "pin_runtime"
    EXPECTED = ("queries/channels.sql", "queries/migrations.sql", "queries/roles.sql")
