"""`identity-fanout outbox quarantine list | show | retry ID | retry --all | discard` as an
operator (and a script, `--json`) runs them (a real PostgreSQL; rows are refused through the
store the relay uses)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg.rows import TupleRow, dict_row

from identity_fanout.outbox.quarantine import QuarantinedRow
from identity_fanout.outbox.records import OutboxRecord
from identity_fanout.outbox.rules import Refusal
from identity_fanout.outbox.writer import OutboxMessage
from identity_fanout.schema import OUTBOX
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


def refuse(
    db: Conn,
    topic: str,
    key: uuid.UUID,
    failure: DeliveryFailure,
    event_type: str = "UserAccessChanged",
) -> int:
    """Write one outbox row and quarantine it as the relay would; its outbox id."""
    with db.transaction():
        OUTBOX.write(
            db,
            [
                OutboxMessage(
                    topic=topic,
                    key=str(key),
                    value=b"x" * 5000,
                    headers=(("pin-message-id", "m"),),
                    message_id=uuid.uuid4(),
                    event_type=event_type,
                )
            ],
        )
    [(outbox_id,)] = db.execute("SELECT max(id) FROM identity.outbox").fetchall()
    record = OutboxRecord(id=outbox_id, topic=topic, key=str(key).encode(), value=b"", headers=[])
    [moved] = OUTBOX.move_to_quarantine(db, [Refusal(record, failure)])
    assert moved.outbox_id == outbox_id
    return int(outbox_id)


def outbox_ids(db: Conn) -> list[int]:
    return [r[0] for r in db.execute("SELECT id FROM identity.outbox ORDER BY id")]


def test_list_show_retry_and_retry_all(db: Conn, identity_dsn: str, operator_dsn: str) -> None:
    empty = run(operator_dsn, "list")
    assert empty.returncode == 0, empty.stderr
    assert "outbox quarantine" in empty.stdout  # the operator's table, its title even empty

    first_user, second_user = uuid.uuid4(), uuid.uuid4()
    refuse(db, "pin.identity.access.v1", first_user, TOO_LARGE)
    refuse(db, "pin.identity.access.v1", second_user, DENIED)
    assert outbox_ids(db) == []
    first, second = OUTBOX.quarantined(db)

    listed = run(operator_dsn, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    decoded = [
        msgspec.json.decode(line, type=QuarantinedRow) for line in listed.stdout.splitlines()
    ]
    assert decoded == [first, second]
    assert [
        (r.key, r.topic, r.error_code, r.error_reason, r.error_message, r.size) for r in decoded
    ] == [
        (
            str(first_user),
            "pin.identity.access.v1",
            "MSG_SIZE_TOO_LARGE",
            "too-large",
            "Broker: Message size too large",
            5000,  # the size of the value
        ),
        (
            str(second_user),
            "pin.identity.access.v1",
            "TOPIC_AUTHORIZATION_FAILED",
            "topic-authorization",
            "Broker: Topic authorization failed",
            5000,
        ),
    ]

    status = cli(operator_dsn, "outbox", "status", "--json")
    assert status.returncode == 0, status.stderr
    assert msgspec.json.decode(status.stdout)["quarantined"] == {"pin.identity.access.v1": 2}

    shown = run(operator_dsn, "show", str(first.id), "--json")
    assert shown.returncode == 0, shown.stderr
    assert msgspec.json.decode(shown.stdout, type=QuarantinedRow) == first  # every field
    assert first.headers == (("pin-message-id", "m"),)

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
        retried = run(operator_dsn, "retry", str(first.id), "--json")
        assert retried.returncode == 0, retried.stderr
        assert list(listener.notifies(timeout=5, stop_after=1)), "no NOTIFY for the relay"
    [requeued] = outbox_ids(db)
    assert requeued > second.outbox_id  # the tail of the outbox, under a new id
    assert msgspec.json.decode(retried.stdout) == {
        "action": "retry",
        "dry_run": False,
        "count": 1,
        "ids": [first.id],
        "rows": [
            {
                "quarantine_id": first.id,
                "outbox_id": requeued,
                "topic": "pin.identity.access.v1",
                "key": str(first_user),
                "attempts": 1,
            }
        ],
    }
    [row] = db.execute(
        "SELECT quarantine_attempts, first_failed_at, payload FROM identity.outbox"
    ).fetchall()
    assert (row[0], row[1], bytes(row[2])) == (1, first.first_failed_at, b"x" * 5000)
    assert [q.id for q in OUTBOX.quarantined(db)] == [second.id]

    everything = run(operator_dsn, "retry", "--all", "--json")
    assert everything.returncode == 0, everything.stderr
    done = msgspec.json.decode(everything.stdout)
    assert (done["dry_run"], done["count"], done["ids"]) == (False, 1, [second.id])
    assert OUTBOX.quarantined(db) == []
    assert len(outbox_ids(db)) == 2
    assert [r["outbox_id"] for r in done["rows"]] == outbox_ids(db)[1:]
    nothing = run(operator_dsn, "retry", "--all")  # the operator's line
    assert (nothing.returncode, nothing.stdout.strip()) == (0, "0 row(s) back in the outbox")


def test_a_dry_run_of_retry_names_the_rows_and_moves_nothing(db: Conn, operator_dsn: str) -> None:
    for _ in range(2):
        refuse(db, "pin.identity.access.v1", uuid.uuid4(), TOO_LARGE)
    first, second = OUTBOX.quarantined(db)
    preview = run(operator_dsn, "retry", "--all", "--dry-run", "--json")
    assert preview.returncode == 0, preview.stderr
    would = msgspec.json.decode(preview.stdout)
    assert (would["dry_run"], would["count"], would["ids"]) == (True, 2, [first.id, second.id])
    # The outbox ids it would have used are not shown: the sequence moved, the rows did not.
    assert [(r["key"], r["outbox_id"]) for r in would["rows"]] == [
        (first.key, None),
        (second.key, None),
    ]
    scripted = run(operator_dsn, "retry", str(first.id), "--dry-run", "--json")
    assert scripted.returncode == 0, scripted.stderr
    would = msgspec.json.decode(scripted.stdout)
    assert (would["dry_run"], would["count"], would["ids"]) == (True, 1, [first.id])
    one = run(operator_dsn, "retry", str(first.id), "--dry-run")  # the operator's lines
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == [
        f"would put quarantined row {first.id} back in the outbox",
        "1 row(s) would be back in the outbox (dry run: nothing changed)",
    ]
    missing = run(operator_dsn, "retry", "999999", "--dry-run", "--json")
    assert (missing.returncode, missing.stdout) == (1, "")
    assert OUTBOX.quarantined(db) == [first, second]
    assert outbox_ids(db) == []


def audit_lines(result: CommandResult) -> list[dict[str, Any]]:
    """The CLI's `outbox quarantined row discarded` lines (JSON log lines, on stderr with
    every log line of the CLI and its error line: stdout is the command's result alone)."""
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "outbox quarantined row discarded"]


def audit_rows(db: Conn) -> list[dict[str, Any]]:
    with db.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT * FROM identity.outbox_quarantine_discards ORDER BY id"
        ).fetchall()


def test_discarding_an_access_event_needs_force_and_leaves_an_audit(
    db: Conn, operator_dsn: str
) -> None:
    first_user, second_user, third_user = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for user in (first_user, second_user, third_user):
        refuse(db, "pin.identity.access.v1", user, TOO_LARGE)
    first, second, third = OUTBOX.quarantined(db)

    for bad in (
        ["discard", str(first.id)],
        ["discard", "--reason", "x"],
        ["discard", "1", "--all"],
        ["discard", str(first.id), "--reason", "  "],
    ):
        assert run(operator_dsn, *bad).returncode == 2, bad  # a reason and one target, always
    missing = run(operator_dsn, "discard", "999999", "--reason", "typo", "--force")
    assert (missing.returncode, missing.stderr.strip()) == (1, "error: no quarantined row 999999")

    # An access event may be a revocation: without --force, refused, and nothing discarded.
    unforced = run(operator_dsn, "discard", str(first.id), "--reason", "reloaded by hand")
    assert unforced.returncode == 2, unforced.stderr
    assert unforced.stderr.strip() == (
        f"error: quarantined row(s) {first.id} carry access events (pin.identity.access.v1): "
        "discarding one may drop a revocation for good; deal with each user's access first "
        "(runbook IdentityOutboxQuarantined), then discard again with --force"
    )
    assert audit_lines(unforced) == []
    everything = run(operator_dsn, "discard", "--all", "--reason", "drill")
    assert everything.returncode == 2, everything.stderr
    assert f"row(s) {first.id}, {second.id}, {third.id} carry access events" in (everything.stderr)
    assert [q.id for q in OUTBOX.quarantined(db)] == [first.id, second.id, third.id]
    assert audit_rows(db) == []
    # A dry run checks as the discard does (--force still needed), then changes nothing: no
    # row gone, no audit row, no audit line.
    unforced_preview = run(operator_dsn, "discard", "--all", "--reason", "drill", "--dry-run")
    assert unforced_preview.returncode == 2, unforced_preview.stderr
    preview = run(
        operator_dsn, "discard", "--all", "--reason", "drill", "--force", "--dry-run", "--json"
    )
    assert preview.returncode == 0, preview.stderr
    would = msgspec.json.decode(preview.stdout)
    assert (would["action"], would["dry_run"], would["count"]) == ("discard", True, 3)
    assert would["ids"] == [first.id, second.id, third.id]
    assert audit_lines(preview) == []
    assert [q.id for q in OUTBOX.quarantined(db)] == [first.id, second.id, third.id]
    assert audit_rows(db) == []

    one = run(
        operator_dsn,
        "discard",
        str(first.id),
        "--reason",
        "access reloaded by hand",
        "--force",
        "--json",
    )
    assert one.returncode == 0, one.stderr
    done = msgspec.json.decode(one.stdout)
    assert (done["dry_run"], done["count"], done["ids"]) == (False, 1, [first.id])
    assert [(r["quarantine_id"], r["key"]) for r in done["rows"]] == [(first.id, str(first_user))]
    [line] = audit_lines(one)
    [login] = db.execute(
        "SELECT rolname FROM pg_roles WHERE rolname = %s",
        (psycopg.conninfo.conninfo_to_dict(operator_dsn)["user"],),
    ).fetchall()
    assert line["level"] == "WARNING"
    assert {k: line[k] for k in ("quarantineId", "outboxId", "userId", "topic", "reason")} == {
        "quarantineId": first.id,
        "outboxId": first.outbox_id,
        "userId": str(first_user),
        "topic": "pin.identity.access.v1",
        "reason": "access reloaded by hand",
    }
    assert (line["messageId"], line["errorCode"], line["forced"]) == (
        str(first.message_id),
        "MSG_SIZE_TOO_LARGE",
        True,
    )
    assert line["databaseLogin"] == login[0]
    assert line["databaseRole"] == login[0]
    assert line["osUser"]
    assert line["host"]
    [audit] = audit_rows(db)
    assert {
        k: audit[k]
        for k in ("quarantine_id", "outbox_id", "message_key", "message_id", "forced", "reason")
    } == {
        "quarantine_id": first.id,
        "outbox_id": first.outbox_id,
        "message_key": str(first_user),
        "message_id": first.message_id,
        "forced": True,
        "reason": "access reloaded by hand",
    }
    assert (audit["database_login"], audit["os_user"], audit["error_reason"]) == (
        login[0],
        line["osUser"],
        "too-large",
    )
    assert {r.key for r in OUTBOX.quarantined(db)} == {str(second_user), str(third_user)}

    rest = run(operator_dsn, "discard", "--all", "--reason", "drill", "--force")
    assert rest.returncode == 0, rest.stderr
    # The operator's lines: one per row, then the count.
    assert rest.stdout.splitlines() == [
        *(
            f"quarantined row {row.id} discarded (topic pin.identity.access.v1, key {row.key}, "
            "too-large, 1 refusal(s))"
            for row in (second, third)
        ),
        "2 row(s) discarded",
    ]
    assert len(audit_lines(rest)) == 2
    assert OUTBOX.quarantined(db) == []
    assert outbox_ids(db) == []  # discarded, not sent again
    assert [a["quarantine_id"] for a in audit_rows(db)] == [first.id, second.id, third.id]


def test_discarding_another_topics_row_needs_no_force_and_is_audited(
    db: Conn, operator_dsn: str
) -> None:
    agent = uuid.uuid4()
    refuse(
        db, "pin.identity.agent-membership-changed.v1", agent, TOO_LARGE, "AgentMembershipChanged"
    )
    [row] = OUTBOX.quarantined(db)
    gone = run(operator_dsn, "discard", str(row.id), "--reason", "membership recorded again")
    assert gone.returncode == 0, gone.stderr
    [line] = audit_lines(gone)
    assert (line["agentUserId"], line["forced"], line["reason"]) == (
        str(agent),
        False,
        "membership recorded again",
    )
    [audit] = audit_rows(db)
    assert (audit["quarantine_id"], audit["forced"]) == (row.id, False)
    assert OUTBOX.quarantined(db) == []
