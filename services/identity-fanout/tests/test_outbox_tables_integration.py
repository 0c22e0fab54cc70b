"""The outbox run on another service's tables: a relay, its quarantine and `outbox status`
given other names use those and leave the identity outbox alone (real PostgreSQL, real Kafka).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from io import StringIO

import psycopg
import pytest
from relay_support import (
    BILLING,
    RelayFactory,
    access_event,
    access_topic,
    outbox_count,
    write,
)

from identity_fanout.ops.outbox import outbox_status
from identity_fanout.outbox.errors import DiscardNeedsForceError
from identity_fanout.outbox.quarantine import Operator
from identity_fanout.outbox.store import OutboxStore
from identity_fanout.outbox.writer import OutboxMessage, outbox_message
from identity_fanout.schema import OUTBOX
from pin_testkit.records import consume
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

MAX_BYTES = 4096


def invoice(topic: str, key: str, size: int = 100) -> OutboxMessage:
    """A record the relay publishes as it is: it never decodes a payload."""
    return OutboxMessage(
        topic=topic,
        key=key,
        value=b"x" * size,
        headers=(("pin-test", "billing"),),
        message_id=uuid.uuid4(),
        event_type="InvoiceIssued",
    )


def billing_count(conn: psycopg.Connection[tuple[int]], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM billing.{table}").fetchone()
    assert row is not None
    return int(row[0])


def test_a_relay_given_other_tables_publishes_and_quarantines_there_only(
    identity_dsn: str,
    kafka_topic: Callable[..., str],
    kafka_bootstrap: str,
    make_relay: RelayFactory,
    json_logs: StringIO,
) -> None:
    with psycopg.connect(identity_dsn, autocommit=True) as db:
        db.execute("CREATE SCHEMA billing")
        for table, model in (
            ("events", "outbox"),
            ("refused", "outbox_quarantine"),
            ("refused_audit", "outbox_quarantine_discards"),
        ):
            db.execute(f"CREATE TABLE billing.{table} (LIKE identity.{model} INCLUDING ALL)")
        # Its key slot function, named by its OutboxTables: every written row's slot is its.
        db.execute(
            "CREATE FUNCTION billing.slot_of(key text) RETURNS smallint LANGUAGE sql IMMUTABLE"
            " AS $$ SELECT identity.outbox_key_slot(key) $$"
        )
        # Its ids, each taken after its slot's writer lock (what migration 0012 gives the
        # identity outbox), under its own lock class.
        db.execute("CREATE SEQUENCE billing.events_id_seq CACHE 1 OWNED BY billing.events.id")
        db.execute(
            "CREATE FUNCTION billing.row_id() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" PERFORM pg_advisory_xact_lock_shared({BILLING.writer_lock_class}, NEW.key_slot);"
            " NEW.id := nextval('billing.events_id_seq'); RETURN NEW; END $$"
        )
        db.execute(
            "CREATE TRIGGER row_id BEFORE INSERT ON billing.events"
            " FOR EACH ROW EXECUTE FUNCTION billing.row_id()"
        )
    topic = access_topic(kafka_topic(partitions=3))
    write(identity_dsn, [outbox_message(access_event(), topic) for _ in range(3)])
    invoices = [invoice(topic.name, f"invoice-{n}") for n in range(4)]
    too_large = invoice(topic.name, "invoice-big", size=MAX_BYTES * 2)
    with psycopg.connect(identity_dsn) as conn:
        assert OutboxStore(BILLING).write(conn, [*invoices[:2], too_large, *invoices[2:]]) == 5

    relay = make_relay(dsn=identity_dsn, tables=BILLING, message_max_bytes=MAX_BYTES)
    with psycopg.connect(identity_dsn, autocommit=True) as db:
        wait_until(
            lambda: relay.run_once() >= 0 and billing_count(db, "events") == 0,
            timeout=30,
            what="the billing outbox drained",
        )
        published = consume(kafka_bootstrap, topic.name, 4)
        assert sorted(r.key() or b"" for r in published) == sorted(m.key.encode() for m in invoices)
        assert outbox_count(identity_dsn) == 3  # the identity outbox is not this relay's
        assert outbox_status(db, OutboxStore(BILLING)).backlog == 0
        assert outbox_status(db, OUTBOX).backlog == 3

        quarantine = OutboxStore(BILLING)
        [refused] = quarantine.quarantined(db)
        assert (refused.key, refused.event_type) == ("invoice-big", "InvoiceIssued")
        assert OUTBOX.quarantined(db) == []
        lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
        [logged] = [line for line in lines if line.get("event") == "outbox row quarantined"]
        assert logged["invoiceId"] == "invoice-big"

        operator = Operator(os_user="test", host="test")
        with pytest.raises(DiscardNeedsForceError, match="carry invoices"):
            quarantine.discard(db, refused.id, reason="test", operator=operator)
        [gone] = quarantine.discard(db, refused.id, reason="test", operator=operator, force=True)
        assert gone.key == "invoice-big"
        assert billing_count(db, "refused") == 0
        assert billing_count(db, "refused_audit") == 1
