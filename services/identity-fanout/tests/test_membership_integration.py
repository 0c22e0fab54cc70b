"""Recording membership changes on a real PostgreSQL; the relay publishing them to Kafka."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import TupleRow
from relay_support import RelayFactory

from identity_fanout.errors import IdentityFanoutError
from identity_fanout.membership import (
    RecordedMembershipChange,
    join_agency,
    leave_agency,
    record_membership_change,
)
from identity_fanout.membership.errors import (
    InvalidMembershipChangeError,
    MembershipAlreadyActiveError,
    MembershipNotActiveError,
)
from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    EMPTY_GUID,
    MESSAGE_ID_HEADER,
    AgentMembershipStatus,
    LeaveReason,
    decode_membership_changed,
    header_text,
)
from pin_runtime.kafka import record_headers
from pin_testkit.concurrency import run_together
from pin_testkit.records import consume
from pin_testkit.service import CommandResult, run_cli, service_environment

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]


@pytest.fixture
def conn(producer_dsn: str) -> Iterator[Conn]:
    """A connection as the identity API holds one: not autocommit, the producer's role."""
    with psycopg.connect(producer_dsn) as connection:
        yield connection


def membership_row(db: Conn, agent: uuid.UUID, company: uuid.UUID) -> dict[str, Any]:
    cur = db.execute(
        "SELECT * FROM identity.agent_memberships WHERE agent_user_id = %s AND company_id = %s",
        (agent, company),
    )
    row = cur.fetchone()
    assert row is not None
    assert cur.description is not None
    return {column.name: value for column, value in zip(cur.description, row, strict=True)}


def outbox_rows(db: Conn) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT topic, message_key, payload, headers, message_id, event_type "
        "FROM identity.outbox ORDER BY id"
    ).fetchall()


def counts(db: Conn) -> tuple[int, int]:
    row = db.execute(
        "SELECT (SELECT count(*) FROM identity.agent_memberships), "
        "(SELECT count(*) FROM identity.outbox)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_join_writes_row_and_event_in_one_transaction(conn: Conn, db: Conn) -> None:
    agent, agency, invitation = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    at = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
    change = join_agency(
        conn, agent, agency, invitation_id=invitation, occurred_at=at, correlation_id="op-1"
    )

    row = membership_row(db, agent, agency)
    assert row["id"] == change.membership_id
    assert (row["status"], row["reason"], row["effective_at"], row["left_at"]) == (
        "Active",
        None,
        None,
        None,
    )
    assert (row["joined_at"], row["invitation_id"], row["version"]) == (at, invitation, 1)

    [(topic, key, value, headers, message_id, event_type)] = outbox_rows(db)
    assert topic == AGENT_MEMBERSHIP_CHANGED.name
    assert key == str(agent)
    assert (message_id, event_type) == (change.message_id, "AgentMembershipChanged")
    assert dict(headers)["pin-message-id"] == str(change.message_id)
    assert dict(headers)["pin-event-type"] == "AgentMembershipChanged"
    assert dict(headers)["pin-contract-version"] == "1"
    envelope = decode_membership_changed(bytes(value))
    assert envelope == change.envelope
    assert (envelope.aggregate_type, envelope.aggregate_id) == (
        "AgentMembership",
        str(change.membership_id),
    )
    assert (envelope.version, envelope.correlation_id, envelope.occurred_at) == (1, "op-1", at)
    payload = envelope.payload
    assert (payload.agent_user_id, payload.company_id, payload.status) == (agent, agency, "Active")
    assert (payload.reason, payload.effective_at, payload.left_at) == (None, None, None)
    assert (payload.joined_at, payload.invitation_id, payload.version) == (at, invitation, 1)


def test_join_leave_rejoin_bumps_the_version_of_one_row(conn: Conn, db: Conn) -> None:
    agent, agency = uuid.uuid4(), uuid.uuid4()
    t0 = datetime(2025, 1, 10, tzinfo=UTC)
    left_at, effective = t0 + timedelta(days=20), t0 + timedelta(days=34)
    first = join_agency(conn, agent, agency, occurred_at=t0)
    left = leave_agency(
        conn,
        agent,
        agency,
        reason=LeaveReason.EXCLUDED_BY_AGENCY,
        effective_at=effective,
        occurred_at=left_at,
    )
    again = join_agency(conn, agent, agency, occurred_at=t0 + timedelta(days=40))

    assert [c.version for c in (first, left, again)] == [1, 2, 3]
    assert {c.membership_id for c in (first, left, again)} == {first.membership_id}
    row = membership_row(db, agent, agency)
    assert (row["status"], row["version"], row["reason"], row["left_at"]) == (
        "Active",
        3,
        None,
        None,
    )

    events = [decode_membership_changed(bytes(r[2])) for r in outbox_rows(db)]
    assert [(e.version, e.payload.status) for e in events] == [
        (1, "Active"),
        (2, "Left"),
        (3, "Active"),
    ]
    leave_event = events[1].payload
    assert leave_event.reason == "ExcludedByAgency"
    assert (leave_event.joined_at, leave_event.left_at, leave_event.effective_at) == (
        t0,
        left_at,
        effective,
    )
    assert events[2].payload.joined_at == t0 + timedelta(days=40)
    assert len({e.message_id for e in events}) == 3


def test_memberships_in_two_agencies_are_independent(conn: Conn, db: Conn) -> None:
    agent, agency_a, agency_b = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    a = join_agency(conn, agent, agency_a)
    b = join_agency(conn, agent, agency_b)
    leave_agency(conn, agent, agency_a, reason="SelfLeave")
    assert a.membership_id != b.membership_id
    assert membership_row(db, agent, agency_a)["status"] == "Left"
    assert membership_row(db, agent, agency_b)["status"] == "Active"
    assert {r[1] for r in outbox_rows(db)} == {str(agent)}


@pytest.mark.parametrize(
    ("prepare", "attempt", "error"),
    [
        (None, {"status": "Left", "reason": "SelfLeave"}, MembershipNotActiveError),
        ("join", {"status": "Active"}, MembershipAlreadyActiveError),
        ("leave", {"status": "Left", "reason": "SelfLeave"}, MembershipNotActiveError),
        ("join", {"status": "Left", "reason": "Fired"}, InvalidMembershipChangeError),
        ("join", {"status": "Left"}, InvalidMembershipChangeError),
        (None, {"status": "Active", "agent_user_id": EMPTY_GUID}, InvalidMembershipChangeError),
        (None, {"status": "Active", "company_id": EMPTY_GUID}, InvalidMembershipChangeError),
        (None, {"status": "Pending"}, InvalidMembershipChangeError),
    ],
)
def test_refused_changes_write_nothing(
    conn: Conn,
    db: Conn,
    prepare: str | None,
    attempt: dict[str, Any],
    error: type[IdentityFanoutError],
) -> None:
    agent, agency = uuid.uuid4(), uuid.uuid4()
    if prepare is not None:
        join_agency(conn, agent, agency)
    if prepare == "leave":
        leave_agency(conn, agent, agency, reason="SelfLeave")
    before_rows = db.execute("SELECT * FROM identity.agent_memberships ORDER BY id").fetchall()
    before = counts(db)
    with pytest.raises(error):
        record_membership_change(conn, **({"agent_user_id": agent, "company_id": agency} | attempt))
    assert counts(db) == before
    assert db.execute("SELECT * FROM identity.agent_memberships ORDER BY id").fetchall() == (
        before_rows
    )
    conn.execute("SELECT 1")  # the connection is usable after the refusal


def test_rolled_back_caller_transaction_takes_the_event_with_it(conn: Conn, db: Conn) -> None:
    agent, agency = uuid.uuid4(), uuid.uuid4()
    with conn.transaction(force_rollback=True):
        join_agency(conn, agent, agency)
    assert counts(db) == (0, 0)


def test_concurrent_first_joins_of_one_pair_record_one(db: Conn, producer_dsn: str) -> None:
    agent, agency = uuid.uuid4(), uuid.uuid4()

    def join(start: threading.Barrier) -> RecordedMembershipChange | IdentityFanoutError:
        with psycopg.connect(producer_dsn) as connection:
            start.wait()
            try:
                return join_agency(connection, agent, agency)
            except MembershipAlreadyActiveError as exc:
                return exc

    outcomes = run_together(join, 4, timeout=30)
    assert len(outcomes) == 4
    recorded = [o for o in outcomes if isinstance(o, RecordedMembershipChange)]
    assert len(recorded) == 1
    assert counts(db) == (1, 1)


# -- the CLI --------------------------------------------------------------------------------


def memberships_cli(dsn: str, *args: str) -> CommandResult:
    env = service_environment(
        ("IDENTITY_FANOUT_",), IDENTITY_FANOUT_DATABASE_DSN=dsn, COLUMNS="250"
    )
    return run_cli("identity-fanout", ["memberships", *args], env, timeout=60, check=False)


def test_cli_join_leave_and_refusals(db: Conn, producer_dsn: str) -> None:
    agent, agency, invitation = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())

    joined = memberships_cli(producer_dsn, "join", agent, agency, "--invitation", invitation)
    assert joined.returncode == 0, joined.stderr
    assert f"agent {agent} Active in agency {agency}, version 1, event " in joined.stdout

    again = memberships_cli(producer_dsn, "join", agent, agency)
    assert again.returncode == 1
    assert again.stderr.strip() == f"error: agent {agent} is already Active in agency {agency}"

    unknown = memberships_cli(producer_dsn, "leave", agent, agency, "--reason", "Fired")
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        "identity-fanout memberships leave: error: argument --reason: unknown value 'Fired' "
        "(known: SelfLeave, ExcludedByAgency) (see identity-fanout memberships leave --help)"
    ]

    empty = memberships_cli(producer_dsn, "join", str(EMPTY_GUID), agency)
    assert empty.returncode == 1
    assert "AgentUserId: must not be Guid.Empty" in empty.stderr

    assert counts(db) == (1, 1)

    left = memberships_cli(
        producer_dsn,
        "leave",
        agent,
        agency,
        "--reason",
        "ExcludedByAgency",
        "--effective-at",
        "2031-01-31T00:00:00+03:00",
    )
    assert left.returncode == 0, left.stderr
    assert "Left in agency" in left.stdout
    assert "version 2, ExcludedByAgency effective 2031-01-31T00:00:00+03:00" in left.stdout

    twice = memberships_cli(producer_dsn, "leave", agent, agency, "--reason", "SelfLeave")
    assert twice.returncode == 1
    assert twice.stderr.strip() == (
        f"error: agent {agent} is Left in agency {agency}; only an Active member leaves"
    )
    assert counts(db) == (1, 2)
    row = membership_row(db, uuid.UUID(agent), uuid.UUID(agency))
    assert (row["status"], row["reason"], row["version"]) == ("Left", "ExcludedByAgency", 2)


@pytest.mark.parametrize(
    "args",
    [
        ("leave", "not-a-uuid", str(uuid.uuid4()), "--reason", "SelfLeave"),
        ("leave", str(uuid.uuid4()), str(uuid.uuid4())),  # --reason is required
        (
            "leave",
            str(uuid.uuid4()),
            str(uuid.uuid4()),
            "--reason",
            "SelfLeave",
            "--effective-at",
            "soon",
        ),
        ("join", str(uuid.uuid4())),
    ],
)
def test_cli_usage_errors_exit_2(args: tuple[str, ...], producer_dsn: str) -> None:
    result = memberships_cli(producer_dsn, *args)
    assert result.returncode == 2


def test_cli_naive_effective_at_is_refused_by_the_parser(db: Conn, producer_dsn: str) -> None:
    agent, agency = str(uuid.uuid4()), str(uuid.uuid4())
    assert memberships_cli(producer_dsn, "join", agent, agency).returncode == 0
    naive = memberships_cli(
        producer_dsn,
        "leave",
        agent,
        agency,
        "--reason",
        "SelfLeave",
        "--effective-at",
        "2031-01-31",
    )
    assert naive.returncode == 2
    assert naive.stderr.strip().splitlines() == [
        "identity-fanout memberships leave: error: argument --effective-at: '2031-01-31': "
        "datetime must carry a UTC offset (see identity-fanout memberships leave --help)"
    ]
    assert counts(db) == (1, 1)


# -- the relay ------------------------------------------------------------------------------


def test_relay_publishes_membership_events_keyed_by_agent(
    conn: Conn,
    db: Conn,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    make_relay: RelayFactory,
) -> None:
    topic = kafka_topic(partitions=3)
    agent, agency = uuid.uuid4(), uuid.uuid4()
    changes = [
        join_agency(conn, agent, agency),
        leave_agency(conn, agent, agency, reason="SelfLeave"),
        join_agency(conn, agent, agency),
    ]
    # The producer writes the catalogue's topic; this test's unique topic stands in for it.
    db.execute("UPDATE identity.outbox SET topic = %s", (topic,))

    relay = make_relay()
    # One record of a key in flight at a time: the agent's three events take a round each.
    assert [relay.run_once() for _ in range(4)] == [1, 1, 1, 0]
    assert counts(db) == (1, 0)

    records = consume(kafka_bootstrap, topic, 3)
    assert len({r.partition() for r in records}) == 1  # one key, one partition: order holds
    assert [r.key() for r in records] == [str(agent).encode()] * 3
    assert [r.value() for r in records] == [c.message.value for c in changes]
    for record, change in zip(records, changes, strict=True):
        headers = record_headers(record)
        assert header_text(headers, MESSAGE_ID_HEADER) == str(change.message_id)
        assert [(n, v.decode() if isinstance(v, bytes) else v) for n, v in headers] == list(
            change.message.headers
        )
    statuses = [decode_membership_changed(r.value()).payload.parsed_status for r in records]
    assert statuses == [
        AgentMembershipStatus.ACTIVE,
        AgentMembershipStatus.LEFT,
        AgentMembershipStatus.ACTIVE,
    ]
