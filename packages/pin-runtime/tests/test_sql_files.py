"""The runtime's own named statements (migrations, runtime roles, LISTEN/NOTIFY, the
horizon watch)."""

from __future__ import annotations

from pin_testkit.sql_checks import SqlFileChecks


class TestSqlFiles(SqlFileChecks):
    PACKAGE = "pin_runtime"
    EXPECTED = (
        "queries/channels.sql",
        "queries/horizon.sql",
        "queries/migrations.sql",
        "queries/roles.sql",
    )
