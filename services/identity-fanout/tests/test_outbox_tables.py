"""The outbox knows no service: every name it uses comes from the `OutboxTables` it is given."""

from __future__ import annotations

import ast
from importlib.resources import files

import pytest
from psycopg import sql
from relay_support import BILLING

from identity_fanout.schema import OUTBOX_TABLES
from pin_contracts import USER_ACCESS_CHANGED
from pin_runtime.sql import load_queries

OUTBOX_SQL = ("lanes.sql", "outbox.sql", "quarantine.sql", "relay.sql")


def test_no_module_of_the_outbox_imports_the_service() -> None:
    package = files("identity_fanout") / "outbox"
    offenders = []
    for module in package.iterdir():
        if not module.name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                name = node.module
            elif isinstance(node, ast.Import):
                name = node.names[0].name
            else:
                continue
            if name.startswith("identity_fanout") and not name.startswith("identity_fanout.outbox"):
                offenders.append(f"{module.name}: {name}")
    assert offenders == []


@pytest.mark.parametrize("filename", OUTBOX_SQL)
def test_every_statement_names_only_the_tables_it_is_given(filename: str) -> None:
    queries = load_queries("identity_fanout", f"outbox/sql/{filename}")
    fragments = {"oldest_first", "by_id"}  # spliced into select_quarantined, never run alone
    for name in queries:
        if name in fragments:
            continue
        parts: dict[str, sql.Composable] = {}
        if "{filter}" in queries[name]:
            parts["filter"] = sql.SQL(queries.by_id)
        if "{heads}" in queries[name]:  # the merged read, of two slots' heads
            heads = (
                BILLING.compose(queries, "slot_head", slot=sql.Literal(s), index=sql.Literal(s + 1))
                for s in (1, 2)
            )
            parts["heads"] = sql.SQL(" UNION ALL ").join(map(sql.SQL, heads))
        if "{slot}" in queries[name]:
            parts["slot"] = sql.Literal(7)
        if "{index}" in queries[name]:
            parts["index"] = sql.Literal(8)
        statement = BILLING.compose(queries, name, **parts)
        assert "identity" not in statement, (filename, name)
        assert "{" not in statement, (filename, name)


def test_lock_classes_follow_the_table_so_two_outboxes_never_share_a_lane() -> None:
    classes = {
        OUTBOX_TABLES.lane_lock_class,
        OUTBOX_TABLES.member_lock_class,
        BILLING.lane_lock_class,
        BILLING.member_lock_class,
    }
    assert len(classes) == 4
    assert all(0 < c < 2**31 for c in classes)


def test_the_service_says_which_rows_need_force_and_how_keys_are_logged() -> None:
    assert OUTBOX_TABLES.needs_force(USER_ACCESS_CHANGED.name, "anything")
    assert OUTBOX_TABLES.needs_force("another.topic", USER_ACCESS_CHANGED.event_type)
    assert not OUTBOX_TABLES.needs_force("pin.identity.membership.v1", "AgentMembershipChanged")
    assert OUTBOX_TABLES.key_field("UserAccessChanged") == "userId"
    assert OUTBOX_TABLES.key_field("AgentMembershipChanged") == "agentUserId"
    assert OUTBOX_TABLES.key_field("SomethingNew") == "messageKey"
    assert BILLING.key_field("UserAccessChanged") == "messageKey"
    assert BILLING.needs_force("any", "InvoiceIssued")
