"""`identity-fanout outbox quarantine list | show | retry ID | retry --all` as an operator
runs them (a real PostgreSQL; rows are refused through the store the relay uses)."""

from __future__ import annotations

import json
import uuid

import msgspec
import psycopg
import pytest
from psycopg.rows import TupleRow

from identity_fanout.outbox import OutboxMessage, write_outbox
from identity_fanout.quarantine import list_quarantined, quarantine_rows
from identity_fanout.relay_records import OutboxRecord
from identity_fanout.relay_settlement import Refusal
from pin_runtime.delivery import DeliveryFailure
from pin_testkit.service import CommandResult, run_cli, service_environment

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
TOO_LARGE = DeliveryFailure(
    "MSG_SIZE_TOO_LARGE", "too-large", "Broker: Message size too large", retriable=False
)
DENIED = DeliveryFailure(
    "TOPIC_AUTHORIZATION_FAILED", "topic-authorization", "Broker: Topic authorization failed", False
)


def run(dsn: str, *args: str) -> CommandResult:
    """`identity-fanout outbox quarantine ARGS`."""
    return cli(dsn, "outbox", "quarantine", *args)


def cli(dsn: str, *args: str) -> CommandResult:
    env = service_environment(
        ("IDENTITY_FANOUT_",), IDENTITY_FANOUT_DATABASE_DSN=dsn, COLUMNS="300"
    )
    return run_cli("identity-fanout", args, env, timeout=60, check=False)


def refuse(db: Conn, topic: str, key: uuid.UUID, failure: DeliveryFailure) -> int:
    """Write one outbox row and quarantine it as the relay would; its outbox id."""
    with db.transaction():
        write_outbox(
            db,
            [
                OutboxMessage(
                    topic=topic,
                    key=str(key),
                    value=b"x" * 5000,
                    headers=(("pin-message-id", "m"),),
                    message_id=uuid.uuid4(),
                    event_type="UserAccessChanged",
                )
            ],
        )
    [(outbox_id,)] = db.execute("SELECT max(id) FROM identity.outbox").fetchall()
    record = OutboxRecord(id=outbox_id, topic=topic, key=str(key).encode(), value=b"", headers=[])
    [moved] = quarantine_rows(db, [Refusal(record, failure)])
    assert moved.outbox_id == outbox_id
    return int(outbox_id)


def outbox_ids(db: Conn) -> list[int]:
    return [r[0] for r in db.execute("SELECT id FROM identity.outbox ORDER BY id")]


def test_list_show_retry_and_retry_all(db: Conn, identity_dsn: str, operator_dsn: str) -> None:
    empty = run(operator_dsn, "list")
    assert empty.returncode == 0, empty.stderr
    assert "outbox quarantine" in empty.stdout

    first_user, second_user = uuid.uuid4(), uuid.uuid4()
    refuse(db, "pin.identity.access.v1", first_user, TOO_LARGE)
    refuse(db, "pin.identity.access.v1", second_user, DENIED)
    assert outbox_ids(db) == []
    first, second = list_quarantined(db)

    listed = run(operator_dsn, "list")
    assert listed.returncode == 0, listed.stderr
    for text in (
        str(first_user),
        str(second_user),
        "MSG_SIZE_TOO_LARGE",
        "too-large",
        "topic-authorization",
        "Broker: Message size too large",
        "5000",  # the size of the value
        "pin.identity.access.v1",
    ):
        assert text in listed.stdout, text

    scripted = run(operator_dsn, "list", "--json")
    assert scripted.returncode == 0, scripted.stderr
    decoded = [msgspec.json.decode(line) for line in scripted.stdout.splitlines()]
    assert [(r["id"], r["key"], r["error_reason"]) for r in decoded] == [
        (first.id, str(first_user), "too-large"),
        (second.id, str(second_user), "topic-authorization"),
    ]

    status = cli(operator_dsn, "outbox", "status")
    assert status.returncode == 0, status.stderr
    assert "quarantined pin.identity.access.v1" in status.stdout
    assert "2 (outbox quarantine list)" in status.stdout

    shown = run(operator_dsn, "show", str(first.id))
    assert shown.returncode == 0, shown.stderr
    assert str(first.message_id) in shown.stdout
    assert "first_failed_at" in shown.stdout
    assert "header pin-message-id" in shown.stdout

    missing = run(operator_dsn, "show", "999999")
    assert (missing.returncode, missing.stderr.strip()) == (1, "error: no quarantined row 999999")
    missing_retry = run(operator_dsn, "retry", "999999")
    assert (missing_retry.returncode, missing_retry.stderr.strip()) == (
        1,
        "error: no quarantined row 999999",
    )
    for bad in (["retry"], ["retry", "1", "--all"], ["show", "x"], ["show", "0"]):
        assert run(operator_dsn, *bad).returncode == 2, bad

    # Listening like the relay: a retry wakes it at once.
    with psycopg.connect(identity_dsn, autocommit=True) as listener:
        listener.execute("LISTEN identity_outbox")
        retried = run(operator_dsn, "retry", str(first.id))
        assert retried.returncode == 0, retried.stderr
        assert list(listener.notifies(timeout=5, stop_after=1)), "no NOTIFY for the relay"
    [requeued] = outbox_ids(db)
    assert requeued > second.outbox_id  # the tail of the outbox, under a new id
    assert retried.stdout.strip() == (
        f"quarantined row {first.id} is back in the outbox as id {requeued} "
        f"(topic pin.identity.access.v1, key {first_user}, 1 refusal(s) so far)"
    )
    [row] = db.execute(
        "SELECT quarantine_attempts, first_failed_at, payload FROM identity.outbox"
    ).fetchall()
    assert (row[0], row[1], bytes(row[2])) == (1, first.first_failed_at, b"x" * 5000)
    assert [q.id for q in list_quarantined(db)] == [second.id]

    everything = run(operator_dsn, "retry", "--all")
    assert everything.returncode == 0, everything.stderr
    assert "1 row(s) back in the outbox" in everything.stdout
    assert list_quarantined(db) == []
    assert len(outbox_ids(db)) == 2
    nothing = run(operator_dsn, "retry", "--all")
    assert (nothing.returncode, nothing.stdout.strip()) == (0, "0 row(s) back in the outbox")


def test_discard_deletes_for_good_and_leaves_an_audit_line(db: Conn, operator_dsn: str) -> None:
    first_user, second_user, third_user = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for user in (first_user, second_user, third_user):
        refuse(db, "pin.identity.access.v1", user, TOO_LARGE)
    first, _second, _third = list_quarantined(db)

    for bad in (
        ["discard", str(first.id)],
        ["discard", "--reason", "x"],
        ["discard", "1", "--all"],
    ):
        assert run(operator_dsn, *bad).returncode == 2, bad  # a reason and one target, always
    missing = run(operator_dsn, "discard", "999999", "--reason", "typo")
    assert (missing.returncode, missing.stderr.strip()) == (1, "error: no quarantined row 999999")

    one = run(operator_dsn, "discard", str(first.id), "--reason", "access reset by hand")
    assert one.returncode == 0, one.stderr
    assert f"quarantined row {first.id} discarded" in one.stdout
    assert str(first_user) in one.stdout
    # The audit line: JSON on stdout, with every log line of the CLI (stderr: failures only).
    audit = [json.loads(line) for line in one.stdout.splitlines() if line.startswith("{")]
    [line] = [a for a in audit if a.get("event") == "outbox quarantined row discarded"]
    assert (line["userId"], line["reason"]) == (str(first_user), "access reset by hand")
    assert {r.key for r in list_quarantined(db)} == {str(second_user), str(third_user)}

    rest = run(operator_dsn, "discard", "--all", "--reason", "drill")
    assert rest.returncode == 0, rest.stderr
    assert "2 row(s) discarded" in rest.stdout
    assert list_quarantined(db) == []
    assert outbox_ids(db) == []  # discarded, not sent again
