"""The named statements of identity-fanout: every file loads, every statement is used."""

from __future__ import annotations

from pin_testkit.sql_checks import SqlFileChecks


class TestSqlFiles(SqlFileChecks):
    PACKAGE = "identity_fanout"
    EXPECTED = (
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
    )
