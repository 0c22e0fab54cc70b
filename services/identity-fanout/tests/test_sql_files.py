"""The named statements of identity-fanout: every file loads, every statement is used."""

from __future__ import annotations

from pin_testkit.sql_checks import SqlFileChecks


class TestSqlFiles(SqlFileChecks):
    PACKAGE = "identity_fanout"
    EXPECTED = (
        "membership/membership.sql",
        "outbox/sql/lanes.sql",
        "outbox/sql/outbox.sql",
        "outbox/sql/quarantine.sql",
        "outbox/sql/relay.sql",
        "sql/channels.sql",
        "sql/fanout.sql",
        "sql/roles.sql",
        "sql/shards.sql",
        "sql/tasks.sql",
        "sql/units.sql",
    )
