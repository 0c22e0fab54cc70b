"""The named statements of identity-fanout: every file loads, every statement is used."""

from __future__ import annotations

from pin_testkit.sql_checks import SqlFileChecks


class TestSqlFiles(SqlFileChecks):
    PACKAGE = "identity_fanout"
    EXPECTED = (
        "fanout/sql/fanout.sql",
        "fanout/sql/roles.sql",
        "fanout/sql/shards.sql",
        "fanout/sql/tasks.sql",
        "fanout/sql/units.sql",
        "membership/membership.sql",
        "ops/sql/sessions.sql",
        "outbox/sql/frontier.sql",
        "outbox/sql/lanes.sql",
        "outbox/sql/outbox.sql",
        "outbox/sql/quarantine.sql",
        "outbox/sql/relay.sql",
    )
