"""The one builder of the access event, the page statement (`page.write_page`), against an
oracle this test owns, on a real PostgreSQL over generated role data.

Both fan-out paths write their events with it: the worker's batch (a page of a unit) and
set-role-permissions' inline fan-out (the whole small role as one page). For the same rows
the test works out itself which users the page holds and each one's snapshot, CompanyId
and ExpiresAt (the fan-out's rules, written here in Python), builds the expected
`UserAccessChangedKafkaEvent` and envelope from `pin_contracts` structs, and compares each
outbox row with it: the value decoded strictly by `pin_contracts` and compared as a value,
the bytes equal to `pin_contracts.encode` of the decoded envelope and of the expected one,
the JSON Schema, and the row's topic, key, headers, MessageId and lane slot."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from psycopg.rows import TupleRow, dict_row

from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.fanout.page import PageOf, write_page
from pin_contracts import (
    USER_ACCESS_CHANGED,
    AccessChangeReason,
    ActiveRoleAssignmentSnapshot,
    Envelope,
    ScopeType,
    UserAccessChangedKafkaEvent,
    decode_access_changed,
    encode,
    envelope_for,
    headers_for,
    kafka_key,
)
from pin_contracts.schemas import schema_file_name
from pin_testkit.seeding import (
    Assignment,
    add_assignments,
    add_permissions,
    add_role,
    seed_role_with_users,
)

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
AccessEnvelope = Envelope[UserAccessChangedKafkaEvent]

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
EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND: Final = timedelta(microseconds=1)
PERMISSION: Final = "page-writer.read"
"""The permission set a role changes to in the inline path (the catalogue has it)."""

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
        "threshold_slack": draw(st.integers(min_value=0, max_value=3)),
        "assignments": assignments,
        "trace": draw(st.sampled_from([{}, {"traceparent": TRACE["traceparent"]}, TRACE])),
    }


# -- the rows, and the oracle --------------------------------------------------------------


@dataclass(frozen=True)
class Seeded:
    """One assignment as the test wrote it: what the oracle needs to know of the row."""

    row: Assignment
    role_code: str
    expires: object
    """None, a datetime (UTC), (epoch seconds, microseconds), 'infinity' or '-infinity'."""


def seed(db: Conn, data: dict[str, Any], now: datetime) -> tuple[list[uuid.UUID], list[Seeded]]:
    roles = [
        add_role(db, code, company_id=company)
        for code, company in zip(data["codes"], data["role_companies"], strict=True)
    ]
    seeded = []
    for a in data["assignments"]:
        expires_in = a["expires_in"]
        expires = now + expires_in if isinstance(expires_in, timedelta) else expires_in
        row = Assignment(
            role_id=roles[a["role"]],
            user_id=a["user"],
            company_id=a["company_id"],
            status=a["status"],
            scope_type=a["scope_type"],
            scope_organization_id=a["scope_organization_id"],
            scope_project_group_id=a["scope_project_group_id"],
            scope_project_id=a["scope_project_id"],
            expires_at=expires if isinstance(expires, datetime) else None,
        )
        seeded.append(Seeded(row, data["codes"][a["role"]], expires))
    add_assignments(db, [s.row for s in seeded])
    for s in seeded:
        set_expires_at(db, s.row.id, s.expires)
    return roles, seeded


def set_expires_at(db: Conn, assignment: uuid.UUID, expires: object) -> None:
    """An ExpiresAt Python cannot hold (beyond year 9999, BC, +-infinity), written in SQL
    exactly (integer days, seconds and microseconds)."""
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
            "                 secs => (%(s)s::bigint %% 86400)::int)"
            " + %(us)s::int * interval '1 microsecond')"
            " AT TIME ZONE 'UTC' WHERE id = %(id)s",
            {"s": seconds, "us": micros, "id": assignment},
        )


def expected_expiry(expires: object, now: datetime) -> tuple[bool, datetime | None]:
    """(in the snapshot, its ExpiresAt): unset or in the future; on the wire in UTC, null
    for 'infinity' and from 10000-01-01 UTC on (the year a client can no longer parse)."""
    if expires is None or expires == "infinity":
        return True, None
    if expires == "-infinity":
        return False, None
    if isinstance(expires, datetime):
        return expires > now, expires.astimezone(UTC)
    assert isinstance(expires, tuple)
    seconds, micros = expires
    at = seconds * 1_000_000 + micros
    if at <= (now - EPOCH) // MICROSECOND:
        return False, None
    if at >= WIRE_END_S * 1_000_000:
        return True, None
    return True, EPOCH + at * MICROSECOND


def expected_events(
    seeded: list[Seeded],
    now: datetime,
    *,
    role: uuid.UUID,
    role_company_id: uuid.UUID | None,
    version: int,
    limit: int,
) -> list[UserAccessChangedKafkaEvent]:
    """The page the test expects, each user's event built from pin_contracts structs: the
    role's users with an Active assignment of it, by UserId, ``limit`` of them; each one's
    Active, unexpired assignments by assignment id; CompanyId the first of them (by id) of
    the role with a tenant, else the role's tenant; no assignment left: an empty snapshot."""
    holders = {s.row.user_id for s in seeded if s.row.role_id == role and s.row.status == "Active"}
    events = []
    for user in sorted(holders)[:limit]:
        kept: list[tuple[Seeded, datetime | None]] = []
        for s in sorted(seeded, key=lambda s: s.row.id):
            included, expires_at = expected_expiry(s.expires, now)
            if s.row.user_id == user and s.row.status == "Active" and included:
                kept.append((s, expires_at))
        tenants = [s.row.company_id for s, _ in kept if s.row.role_id == role and s.row.company_id]
        events.append(
            UserAccessChangedKafkaEvent(
                user_id=user,
                company_id=tenants[0] if tenants else role_company_id,
                change_reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED,
                active_assignments=tuple(
                    ActiveRoleAssignmentSnapshot(
                        assignment_id=s.row.id,
                        role_id=s.row.role_id,
                        role_code=s.role_code,
                        scope_type=s.row.scope_type,
                        scope_organization_id=s.row.scope_organization_id,
                        scope_project_group_id=s.row.scope_project_group_id,
                        scope_project_id=s.row.scope_project_id,
                        expires_at=expires_at,
                    )
                    for s, expires_at in kept
                ),
                version=version,
            )
        )
    return events


def outbox_rows(db: Conn) -> list[dict[str, Any]]:
    with db.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT topic, message_key, payload, headers, message_id, event_type, key_slot,"
            " identity.outbox_key_slot(message_key) AS migration_slot"
            " FROM identity.outbox ORDER BY message_key::uuid"  # the page's order: by user
        ).fetchall()


def check_rows(
    db: Conn,
    events: list[UserAccessChangedKafkaEvent],
    *,
    correlation_id: str | None,
    trace_context: dict[str, str],
    written_between: tuple[datetime, datetime],
) -> list[AccessEnvelope]:
    """The outbox holds exactly ``events``' records, each as pin_contracts defines it; the
    decoded envelopes."""
    rows = outbox_rows(db)
    assert len(rows) == len(events)
    decoded = [decode_access_changed(bytes(row["payload"])) for row in rows]  # strict
    # The two values the builder draws itself: one OccurredAt per page, when it was written,
    # and a MessageId per record.
    assert len({e.occurred_at for e in decoded}) == 1
    assert written_between[0] <= decoded[0].occurred_at <= written_between[1]
    assert len({e.message_id for e in decoded}) == len(decoded)
    for row, written, event in zip(rows, decoded, events, strict=True):
        value = bytes(row["payload"])
        SCHEMA.validate(json.loads(value))  # and the committed JSON Schema
        expected = msgspec.structs.replace(
            envelope_for(event, correlation_id=correlation_id, occurred_at=written.occurred_at),
            message_id=written.message_id,
        )
        # As values: the envelope, the payload and every snapshot's fields.
        assert written.payload.active_assignments == event.active_assignments
        assert written.payload == event
        assert written == expected
        # Byte for byte what msgspec writes: compact, the contract's field order, explicit
        # nulls, timestamps in UTC with "Z", in every session TimeZone.
        assert value == encode(written)
        assert value == encode(expected)
        assert row["topic"] == USER_ACCESS_CHANGED.name
        assert row["message_key"] == kafka_key(expected).decode() == str(event.user_id)
        assert row["message_id"] == written.message_id
        assert row["event_type"] == UserAccessChangedKafkaEvent.EVENT_TYPE
        # Stored as [name, text] pairs, the relay's to encode.
        stored = [
            [name, text.decode() if isinstance(text, bytes) else text]
            for name, text in headers_for(expected, trace_context=trace_context)
        ]
        assert row["headers"] == stored
        assert row["key_slot"] == row["migration_slot"]
    return decoded


@contextmanager
def current_span(trace_context: dict[str, str]) -> Iterator[None]:
    """The span of ``trace_context`` active, as a traced operation runs under it."""
    if "traceparent" not in trace_context:
        yield
        return
    _, trace_id, span_id, flags = trace_context["traceparent"].split("-")
    state = (
        [tuple(trace_context["tracestate"].split("=", 1))] if "tracestate" in trace_context else []
    )
    context = SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=False,
        trace_flags=TraceFlags(int(flags, 16)),
        trace_state=TraceState([(key, value) for key, value in state]),
    )
    with trace.use_span(NonRecordingSpan(context)):
        yield


# -- the two callers -----------------------------------------------------------------------


def worker_page(
    db: Conn,
    seeded: list[Seeded],
    now: datetime,
    *,
    role: uuid.UUID,
    role_company_id: uuid.UUID | None,
    version: int,
    limit: int,
    correlation_id: str | None,
    trace_context: dict[str, str],
) -> list[AccessEnvelope]:
    """A worker's page from the role's first user, checked against the oracle."""
    events = expected_events(
        seeded, now, role=role, role_company_id=role_company_id, version=version, limit=limit
    )
    before = datetime.now(UTC)
    page = PageOf(role, role_company_id, version, None, None, limit)
    written = write_page(db, page, correlation_id=correlation_id, trace_context=trace_context)
    after = datetime.now(UTC)
    assert written == (len(events), events[-1].user_id if events else None)
    return check_rows(
        db,
        events,
        correlation_id=correlation_id,
        trace_context=trace_context,
        written_between=(before, after),
    )


def inline_change(
    db: Conn,
    seeded: list[Seeded],
    now: datetime,
    *,
    role: uuid.UUID,
    role_company_id: uuid.UUID | None,
    correlation_id: str | None,
    trace_context: dict[str, str],
    threshold_slack: int = 0,
) -> list[AccessEnvelope]:
    """set-role-permissions of a role at or below the threshold, checked against the
    oracle: every user of the role, the role's next Version and tenant, the correlation id
    given (or a fresh one), the trace context of the span it runs under."""
    row = db.execute(
        "SELECT version FROM identity.role_definitions WHERE id = %s", (role,)
    ).fetchone()
    assert row is not None
    version = row[0] + 1
    events = expected_events(
        seeded, now, role=role, role_company_id=role_company_id, version=version, limit=10**6
    )
    before = datetime.now(UTC)
    with current_span(trace_context):
        change = set_role_permissions(
            db,
            role,
            [PERMISSION],
            inline_threshold=len(events) + threshold_slack,
            correlation_id=correlation_id,
        )
    after = datetime.now(UTC)
    assert (change.mode, change.version, change.users) == ("inline", version, len(events))
    correlation = correlation_id
    if correlation is None:  # a fresh one per change, the same on each of its records
        correlation = decode_access_changed(bytes(outbox_rows(db)[0]["payload"])).correlation_id
        assert correlation is not None
        uuid.UUID(correlation)
    return check_rows(
        db,
        events,
        correlation_id=correlation,
        trace_context=trace_context,
        written_between=(before, after),
    )


def transaction_now(db: Conn) -> datetime:
    """The snapshot's now(): the transaction's start, in UTC."""
    now: datetime = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    return now.astimezone(UTC)


# -- over generated rows -------------------------------------------------------------------


@pytest.mark.parametrize(
    "timezone", ["UTC", "America/St_Johns", "Asia/Kathmandu", "Pacific/Kiritimati", "Etc/GMT+12"]
)
def test_both_paths_write_the_oracles_records(db: Conn, timezone: str) -> None:
    # The session's TimeZone must not matter: the statement reads and writes UTC itself (a
    # session pins UTC anyway, pin_runtime.postgres.SessionLimits; this one does not).
    db.execute("SELECT set_config('TimeZone', %s, false)", (timezone,))
    add_permissions(db, [PERMISSION])

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(data=role_data())
    def example(data: dict[str, Any]) -> None:
        with db.transaction(force_rollback=True):
            now = transaction_now(db)
            roles, seeded = seed(db, data, now)
            worker_page(
                db,
                seeded,
                now,
                role=roles[0],
                role_company_id=data["role_company_id"],
                version=data["version"],
                limit=data["limit"],
                correlation_id=data["correlation_id"],
                trace_context=data["trace"],
            )
            db.execute("DELETE FROM identity.outbox")
            inline_change(
                db,
                seeded,
                now,
                role=roles[0],
                role_company_id=data["role_companies"][0],
                correlation_id=data["correlation_id"],
                trace_context=data["trace"],
                threshold_slack=data["threshold_slack"],
            )

    example()


# -- the edges, by name, on both paths -----------------------------------------------------

PATHS: Final = ["worker", "inline"]


def fan_out(
    db: Conn,
    path: str,
    seeded: list[Seeded],
    *,
    role: uuid.UUID,
    role_company_id: uuid.UUID | None,
    trace_context: dict[str, str] | None = None,
) -> list[AccessEnvelope]:
    """The role's change written by ``path`` and checked against the oracle."""
    now = transaction_now(db)
    if path == "worker":
        return worker_page(
            db,
            seeded,
            now,
            role=role,
            role_company_id=role_company_id,
            version=7,
            limit=500,
            correlation_id="run-1",
            trace_context=trace_context or {},
        )
    add_permissions(db, [PERMISSION])
    return inline_change(
        db,
        seeded,
        now,
        role=role,
        role_company_id=role_company_id,
        correlation_id="change-1",
        trace_context=trace_context or {},
    )


def add(db: Conn, rows: list[tuple[Assignment, str, object]]) -> list[Seeded]:
    """Assignments with their role codes and ExpiresAt (as `Seeded.expires`)."""
    seeded = [
        Seeded(
            msgspec.structs.replace(row, expires_at=expires)
            if isinstance(expires, datetime)
            else row,
            code,
            expires,
        )
        for row, code, expires in rows
    ]
    add_assignments(db, [s.row for s in seeded])
    for s in seeded:
        set_expires_at(db, s.row.id, s.expires)
    return seeded


def ids(count: int) -> list[uuid.UUID]:
    """Assignment ids in ascending order (the snapshot's order)."""
    return sorted(uuid.uuid4() for _ in range(count))


@pytest.mark.parametrize("path", PATHS)
def test_no_expired_revoked_or_lapsed_assignment_is_ever_sent(db: Conn, path: str) -> None:
    company = uuid.uuid4()
    role = add_role(db, "viewer", company_id=company)
    user = uuid.uuid4()
    now = transaction_now(db)
    kept, far = now + timedelta(days=1), datetime.max.replace(tzinfo=UTC)
    seeded = add(
        db,
        [
            (Assignment(role_id=role, user_id=user), "viewer", kept),
            (Assignment(role_id=role, user_id=user, status="Expired"), "viewer", None),
            (Assignment(role_id=role, user_id=user, status="Revoked"), "viewer", None),
            (Assignment(role_id=role, user_id=user), "viewer", (0, 0)),  # 1970: lapsed
            (Assignment(role_id=role, user_id=user), "viewer", "-infinity"),
            (Assignment(role_id=role, user_id=user), "viewer", far),
        ],
    )
    [written] = fan_out(db, path, seeded, role=role, role_company_id=company)
    snapshots = written.payload.active_assignments
    assert {(s.assignment_id, s.expires_at) for s in snapshots} == {
        (seeded[0].row.id, kept),
        (seeded[5].row.id, far),
    }


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("timezone", ["UTC", "Pacific/Kiritimati", "Etc/GMT+12"])
def test_expiry_beyond_the_wire_goes_out_as_none_and_microseconds_are_kept(
    db: Conn, path: str, timezone: str
) -> None:
    db.execute("SELECT set_config('TimeZone', %s, false)", (timezone,))
    role = add_role(db, "viewer")
    user = uuid.uuid4()
    last_s = WIRE_END_S - 1
    expiries: list[object] = [
        (last_s, 999_999),  # 9999-12-31T23:59:59.999999Z: the last the wire carries
        (WIRE_END_S, 0),  # 10000-01-01T00:00:00Z: none
        (WIRE_END_S, 1),
        (WIRE_END_S + 86_400 * 366 * 5, 0),
        "infinity",
        datetime(2031, 2, 3, 4, 5, 6, 1, tzinfo=UTC),
        datetime(2031, 2, 3, 4, 5, 6, 500_000, tzinfo=UTC),
        datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC),
    ]
    seeded = add(
        db,
        [
            (Assignment(role_id=role, user_id=user, id=i), "viewer", expires)
            for i, expires in zip(ids(len(expiries)), expiries, strict=True)
        ],
    )
    [written] = fan_out(db, path, seeded, role=role, role_company_id=None)
    assert [s.expires_at for s in written.payload.active_assignments] == [
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        None,
        None,
        None,
        None,
        datetime(2031, 2, 3, 4, 5, 6, 1, tzinfo=UTC),
        datetime(2031, 2, 3, 4, 5, 6, 500_000, tzinfo=UTC),
        datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC),
    ]
    value = encode(written)
    assert b'"ExpiresAt":"9999-12-31T23:59:59.999999Z"' in value
    assert b'"ExpiresAt":"2031-02-03T04:05:06.000001Z"' in value
    assert b'"ExpiresAt":"2031-02-03T04:05:06Z"' in value


@pytest.mark.parametrize("path", PATHS)
def test_a_user_left_without_assignments_gets_an_empty_snapshot(db: Conn, path: str) -> None:
    company = uuid.uuid4()
    role = add_role(db, "viewer", company_id=company)
    kept, gone = sorted([uuid.uuid4(), uuid.uuid4()])
    seeded = add(
        db,
        [
            (Assignment(role_id=role, user_id=kept, company_id=uuid.uuid4()), "viewer", None),
            # Active still, but lapsed: the page holds the user, the snapshot nothing.
            (Assignment(role_id=role, user_id=gone), "viewer", (0, 0)),
        ],
    )
    _, written = fan_out(db, path, seeded, role=role, role_company_id=company)
    payload = written.payload
    assert (payload.user_id, payload.company_id, payload.active_assignments) == (gone, company, ())


@pytest.mark.parametrize("path", PATHS)
def test_company_is_the_first_tenant_of_the_changed_roles_assignments(db: Conn, path: str) -> None:
    role_tenant, first, second, other_tenant, lapsed_tenant = (uuid.uuid4() for _ in range(5))
    role = add_role(db, "changed", company_id=role_tenant)
    other = add_role(db, "other", company_id=other_tenant)
    tenanted, untenanted = sorted([uuid.uuid4(), uuid.uuid4()])
    a = ids(6)
    seeded = add(
        db,
        [
            # Another role's tenant and a lapsed assignment's tenant come first by id and
            # do not count; the changed role's first assignment with a tenant does.
            (
                Assignment(id=a[0], role_id=other, user_id=tenanted, company_id=other_tenant),
                "other",
                None,
            ),
            (
                Assignment(id=a[1], role_id=role, user_id=tenanted, company_id=lapsed_tenant),
                "changed",
                (0, 0),
            ),
            (Assignment(id=a[2], role_id=role, user_id=tenanted), "changed", None),
            (
                Assignment(id=a[3], role_id=role, user_id=tenanted, company_id=first),
                "changed",
                None,
            ),
            (
                Assignment(id=a[4], role_id=role, user_id=tenanted, company_id=second),
                "changed",
                None,
            ),
            # No assignment of the changed role with a tenant: the role's own.
            (Assignment(id=a[5], role_id=role, user_id=untenanted), "changed", None),
        ],
    )
    events = fan_out(db, path, seeded, role=role, role_company_id=role_tenant)
    assert [e.payload.company_id for e in events] == [first, role_tenant]
    assert [s.role_code for s in events[0].payload.active_assignments] == ["other"] + [
        "changed"
    ] * 3


@pytest.mark.parametrize("path", PATHS)
def test_role_codes_with_quotes_and_unicode_are_escaped_as_msgspec_does(
    db: Conn, path: str
) -> None:
    # Cyrillic, a quote, a backslash, controls, a line separator, an emoji, braces.
    code = '\u0420\u043e\u043b\u044c "q" \\ </script> \t\n\x01\x7f\u2028 \U0001f600 {{}}'
    role = add_role(db, code)
    user = uuid.uuid4()
    seeded = add(db, [(Assignment(role_id=role, user_id=user), code, None)])
    [written] = fan_out(db, path, seeded, role=role, role_company_id=None, trace_context=TRACE)
    [snapshot] = written.payload.active_assignments
    assert snapshot.role_code == code


# -- the worker's pages ----------------------------------------------------------------------


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
