"""The worker's batch built in SQL (`batch.write_page`) puts on the wire exactly what
the Python builder does (`inline.build_events` + `pin_contracts.encode` + `headers_for`)
for the same rows, on a real PostgreSQL, over generated role data."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

# jsonschema ships no type stubs, and the workspace's dev group (not ours) pins tools.
import jsonschema  # type: ignore[import-untyped]
import msgspec
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import TupleRow, dict_row

from identity_fanout.fanout.assignments import page_users
from identity_fanout.fanout.batch import WRITE_PAGE, PageOf, page_parameters, write_page
from identity_fanout.fanout.enqueue import snapshot_events
from identity_fanout.outbox.writer import outbox_message
from pin_contracts import (
    USER_ACCESS_CHANGED,
    Envelope,
    ScopeType,
    UserAccessChangedKafkaEvent,
    decode_access_changed,
    encode,
    envelope_for,
)
from pin_contracts.schemas import schema_file_name
from pin_testkit.seeding import Assignment, add_assignments, add_role, seed_role_with_users

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]

SCHEMA: Final = jsonschema.Draft202012Validator(
    json.loads(
        (
            Path(__file__).resolve().parents[3]
            / "contracts"
            / "schemas"
            / schema_file_name(UserAccessChangedKafkaEvent)
        ).read_text()
    ),
    format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
)
"""The committed JSON Schema of the record value (contracts/schemas)."""

TRACE: Final = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "pin=1",
}

# Role codes PostgreSQL stores (no NUL) and JSON must escape (quotes, controls, non-ASCII).
codes = st.text(
    st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), min_size=1, max_size=20
)
maybe_ids = st.one_of(st.none(), st.uuids())
# ExpiresAt around now: lapsed, in the future, with and without microseconds.
near_now = st.one_of(
    st.timedeltas(min_value=timedelta(days=-30), max_value=timedelta(days=3650)),
    st.integers(min_value=-3600, max_value=10**8).map(lambda s: timedelta(seconds=s)),
)
# And every value the column can hold (pin_contracts README "Timestamps"): +-infinity, the
# whole timestamptz range (4714-11-24 BC .. 294276-12-31 UTC) as (epoch seconds,
# microseconds), most often around the wire's end at 10000-01-01 UTC.
TIMESTAMPTZ_MIN_S: Final = -210_866_803_200
TIMESTAMPTZ_MAX_S: Final = 9_224_318_015_999
WIRE_END_S: Final = 253_402_300_800
anywhere = st.tuples(
    st.one_of(
        st.integers(min_value=TIMESTAMPTZ_MIN_S, max_value=TIMESTAMPTZ_MAX_S),
        st.integers(min_value=WIRE_END_S - 2 * 86_400, max_value=WIRE_END_S + 86_400),
    ),
    st.sampled_from([0, 999_999]) | st.integers(min_value=0, max_value=999_999),
)
offsets = st.one_of(st.none(), near_now, anywhere, st.sampled_from(["infinity", "-infinity"]))


@st.composite
def role_data(draw: st.DrawFn) -> dict[str, Any]:
    role_codes = draw(st.lists(codes, min_size=2, max_size=4, unique=True))
    users = sorted(draw(st.lists(st.uuids(), min_size=1, max_size=6, unique=True)))
    assignments = []
    for user in users:
        for _ in range(draw(st.integers(min_value=0, max_value=4))):
            assignments.append(
                {
                    "user": user,
                    "role": draw(st.integers(min_value=0, max_value=len(role_codes) - 1)),
                    "company_id": draw(maybe_ids),
                    "status": draw(st.sampled_from(["Active", "Active", "Revoked", "Expired"])),
                    "scope_type": draw(st.sampled_from([s.value for s in ScopeType])),
                    "scope_organization_id": draw(maybe_ids),
                    "scope_project_group_id": draw(maybe_ids),
                    "scope_project_id": draw(maybe_ids),
                    "expires_in": draw(offsets),
                }
            )
    # The changed role always has an Active holder, so the page is never empty.
    holder = {
        "user": users[0],
        "role": 0,
        "company_id": draw(maybe_ids),
        "status": "Active",
        "scope_type": "Company",
        "scope_organization_id": None,
        "scope_project_group_id": None,
        "scope_project_id": None,
        "expires_in": None,
    }
    assignments.append(holder)
    return {
        "codes": role_codes,
        "role_company_id": draw(maybe_ids),
        "role_companies": [draw(maybe_ids) for _ in role_codes],
        "version": draw(st.integers(min_value=1, max_value=2**63 - 1)),
        "correlation_id": draw(st.one_of(st.none(), codes)),
        "limit": draw(st.integers(min_value=1, max_value=8)),
        "assignments": assignments,
        "trace": draw(st.sampled_from([{}, {"traceparent": TRACE["traceparent"]}, TRACE])),
    }


def seed(db: Conn, data: dict[str, Any], now: datetime) -> list[uuid.UUID]:
    roles = [
        add_role(db, code, company_id=company)
        for code, company in zip(data["codes"], data["role_companies"], strict=True)
    ]
    assignments = [
        Assignment(
            role_id=roles[a["role"]],
            user_id=a["user"],
            company_id=a["company_id"],
            status=a["status"],
            scope_type=a["scope_type"],
            scope_organization_id=a["scope_organization_id"],
            scope_project_group_id=a["scope_project_group_id"],
            scope_project_id=a["scope_project_id"],
            expires_at=now + a["expires_in"] if isinstance(a["expires_in"], timedelta) else None,
        )
        for a in data["assignments"]
    ]
    add_assignments(db, assignments)
    for assignment, a in zip(assignments, data["assignments"], strict=True):
        set_expires_at(db, assignment.id, a["expires_in"])
    return roles


def set_expires_at(db: Conn, assignment: uuid.UUID, expires: object) -> None:
    """An ExpiresAt Python cannot hold (beyond year 9999, BC, +-infinity), written in SQL."""
    if isinstance(expires, str):
        db.execute(
            "UPDATE identity.role_assignments SET expires_at = %s::timestamptz WHERE id = %s",
            (expires, assignment),
        )
    elif isinstance(expires, tuple):
        seconds, micros = expires
        db.execute(
            # In UTC, as a timestamp without zone: near the range's ends a session's own
            # offset would push the arithmetic out of range.
            "UPDATE identity.role_assignments SET expires_at = ('epoch'::timestamp"
            " + make_interval(days => (%(s)s::bigint / 86400)::int,"
            "                 secs => (%(s)s::bigint %% 86400) + %(us)s::float8 / 1e6))"
            " AT TIME ZONE 'UTC' WHERE id = %(id)s",
            {"s": seconds, "us": micros, "id": assignment},
        )


def outbox_rows(db: Conn) -> list[dict[str, Any]]:
    with db.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT topic, message_key, payload, headers, message_id, event_type, key_slot,"
            " identity.outbox_key_slot(message_key) AS migration_slot"
            " FROM identity.outbox ORDER BY message_key::uuid"  # the page's order: by user
        ).fetchall()


def python_envelope(
    event: UserAccessChangedKafkaEvent, written: Envelope[UserAccessChangedKafkaEvent]
) -> Envelope[UserAccessChangedKafkaEvent]:
    """The Python builder's envelope with the SQL row's MessageId and OccurredAt (the two
    values each builder draws itself)."""
    built = envelope_for(event, correlation_id=written.correlation_id)
    return msgspec.structs.replace(
        built, message_id=written.message_id, occurred_at=written.occurred_at
    )


def compare_page(db: Conn, data: dict[str, Any], role: uuid.UUID) -> None:
    """write_page's rows against the Python builder's records for the same page."""
    occurred_at = datetime.now(UTC)
    page = PageOf(
        role_id=role,
        role_company_id=data["role_company_id"],
        version=data["version"],
        after=None,
        upper=None,
        limit=data["limit"],
    )
    params = page_parameters(
        page,
        correlation_id=data["correlation_id"],
        trace_context=data["trace"],
        occurred_at=occurred_at,
    )
    users, last_user = db.execute(WRITE_PAGE, params).fetchone() or (0, None)
    expected_users = page_users(db, role, None, data["limit"])
    events = snapshot_events(
        db,
        expected_users,
        role_id=role,
        role_company_id=data["role_company_id"],
        version=data["version"],
    )
    rows = outbox_rows(db)
    assert users == len(expected_users) == len(rows) >= 1
    assert last_user == expected_users[-1]
    for row, event in zip(rows, events, strict=True):
        value = bytes(row["payload"])
        written = decode_access_changed(value)  # the contract's strict decode
        SCHEMA.validate(json.loads(value))  # and the committed JSON Schema
        # Field by field: the payload Struct (UserId, CompanyId, ChangeReason, every
        # snapshot's fields in order, Version) and the envelope.
        assert written.payload == event
        assert written.payload.active_assignments == event.active_assignments
        assert written.payload.company_id == event.company_id
        expected = python_envelope(event, written)
        assert written.event_type == expected.event_type
        assert written.contract_version == expected.contract_version
        assert written.aggregate_type == expected.aggregate_type
        assert written.aggregate_id == expected.aggregate_id
        assert written.version == expected.version == data["version"]
        assert written.correlation_id == data["correlation_id"]
        assert written.occurred_at == occurred_at
        # Byte for byte what pin_contracts.encode writes: re-encoding the decoded envelope
        # gives the same bytes (compact, the contract's field order, timestamps in UTC
        # with "Z"), and so does the Python builder's own envelope, in every session
        # TimeZone (both read ExpiresAt in UTC).
        assert value == encode(written)
        assert value == encode(expected)
        record = outbox_message(expected, USER_ACCESS_CHANGED, trace_context=data["trace"])
        assert row["topic"] == record.topic
        assert row["message_key"] == record.key
        assert row["message_id"] == record.message_id == written.message_id
        assert row["event_type"] == record.event_type
        assert [tuple(pair) for pair in row["headers"]] == list(record.headers)
        assert row["key_slot"] == row["migration_slot"]


@pytest.mark.parametrize(
    "timezone", ["UTC", "America/St_Johns", "Asia/Kathmandu", "Pacific/Kiritimati", "Etc/GMT+12"]
)
def test_sql_built_records_are_the_python_builders(db: Conn, timezone: str) -> None:
    # The session's TimeZone must not matter: both builders read and write UTC themselves
    # (a session pins UTC anyway, pin_runtime.postgres.SessionLimits; this one does not).
    db.execute("SELECT set_config('TimeZone', %s, false)", (timezone,))
    db.commit()

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(data=role_data())
    def example(data: dict[str, Any]) -> None:
        with db.transaction(force_rollback=True):
            now = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            roles = seed(db, data, now)
            compare_page(db, data, roles[0])

    example()


def test_no_expired_revoked_or_lapsed_assignment_is_ever_sent(db: Conn) -> None:
    role = add_role(db, "viewer", company_id=uuid.uuid4())
    user = uuid.uuid4()
    now = datetime.now(UTC)
    kept = Assignment(role_id=role, user_id=user, expires_at=now + timedelta(days=1))
    add_assignments(
        db,
        [
            kept,
            Assignment(role_id=role, user_id=user, status="Expired"),
            Assignment(role_id=role, user_id=user, status="Revoked"),
            Assignment(role_id=role, user_id=user, expires_at=now - timedelta(seconds=1)),
            Assignment(role_id=role, user_id=user, expires_at=datetime.max.replace(tzinfo=UTC)),
        ],
    )
    page = PageOf(role, None, 3, None, None, 10)
    assert write_page(db, page, correlation_id="run", trace_context={}).users == 1
    [row] = outbox_rows(db)
    written = decode_access_changed(bytes(row["payload"]))
    snapshots = written.payload.active_assignments
    assert kept.id in [a.assignment_id for a in snapshots]
    assert len(snapshots) == 2  # kept and the far-future one, nothing else
    assert all(a.expires_at is not None and a.expires_at > now for a in snapshots)


def test_infinite_expiry_goes_out_as_no_expiry(db: Conn) -> None:
    role = add_role(db, "viewer")
    user = uuid.uuid4()
    assignment = Assignment(role_id=role, user_id=user)
    add_assignments(db, [assignment])
    db.execute(
        "UPDATE identity.role_assignments SET expires_at = 'infinity' WHERE id = %s",
        (assignment.id,),
    )
    write_page(db, PageOf(role, None, 1, None, None, 10), correlation_id=None, trace_context={})
    [row] = outbox_rows(db)
    [snapshot] = decode_access_changed(bytes(row["payload"])).payload.active_assignments
    assert snapshot.assignment_id == assignment.id
    assert snapshot.expires_at is None


def test_a_user_left_without_assignments_gets_an_empty_snapshot(db: Conn) -> None:
    company = uuid.uuid4()
    role = add_role(db, "viewer", company_id=company)
    user = uuid.uuid4()
    add_assignments(
        db, [Assignment(role_id=role, user_id=user, expires_at=datetime.now(UTC) - timedelta(1))]
    )
    written = write_page(
        db, PageOf(role, company, 2, None, None, 10), correlation_id=None, trace_context={}
    )
    assert written == (1, user)
    [row] = outbox_rows(db)
    payload = decode_access_changed(bytes(row["payload"])).payload
    assert (payload.user_id, payload.company_id, payload.active_assignments) == (user, company, ())


def test_the_page_gives_every_row_its_keys_slot_by_the_slot_function(db: Conn) -> None:
    """Every row's lane slot is the slot function's of its key (the one definition)."""
    role, users = seed_role_with_users(db, users=3000, other_roles=0)
    written = write_page(
        db, PageOf(role, None, 1, None, None, 5000), correlation_id=None, trace_context={}
    )
    assert written == (3000, users[-1])
    rows = db.execute(
        "SELECT identity.outbox_key_slot(message_key), key_slot, message_key::uuid"
        " FROM identity.outbox ORDER BY id"
    ).fetchall()
    assert len(rows) == 3000
    assert [slot for _, slot, _ in rows] == [expected for expected, _, _ in rows]
    assert len({slot for _, slot, _ in rows}) == 64  # every slot reached
    # Clustered by lane: ids follow the slot, then the user.
    assert [(slot, user) for _, slot, user in rows] == sorted((s, u) for _, s, u in rows)


def test_pages_walk_a_range_in_order(db: Conn) -> None:
    role, users = seed_role_with_users(db, users=25, other_roles=1)
    after, seen = None, []
    while True:
        page = PageOf(role, None, 1, after, users[19], 7)
        written = write_page(db, page, correlation_id=None, trace_context={})
        if written.users == 0:
            break
        after = written.last_user
        seen.append(written.users)
    assert seen == [7, 7, 6]  # up to the range's upper bound (inclusive), not beyond
    # Each user once; within a page the rows are clustered by lane, not by user.
    keys = [row[0] for row in db.execute("SELECT message_key FROM identity.outbox ORDER BY id")]
    assert sorted(keys, key=uuid.UUID) == [str(u) for u in users[:20]]
