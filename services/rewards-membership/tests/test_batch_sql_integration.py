"""The batch statement (`sql/batch.sql`) decides exactly as the pure `plan_batch` does.

`rules/plan.plan_batch` (with `rules/guard.is_stale` and `transition`) is the spec's
executable definition of a batch; the consumer makes the same decisions inside its one
statement. On generated batches against a real PostgreSQL (as the consumer's runtime role),
from the same inbox keys and rows, both must give the same outcome for every record in
order, the same rows (every membership column) and the same inbox marks.

The batches come from record values through `validate`, as the consumer's come: several
events per (agent, agency) row within one batch, MessageIds repeated within the batch and
already in the inbox (their content may differ), stale and equal Versions, unknown and
absent Status and Reason, null LeftAt/EffectiveAt, joins and leaves interleaved, rows
present beforehand (with any membership state, null timestamps included) or missing, and
dead letters (undecodable, Guid.Empty) keyed as the loop keys them.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any, Final

import msgspec
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import TupleRow, class_row

from pin_contracts import EMPTY_GUID, encode, envelope_for
from pin_runtime.postgres import SessionLimits
from pin_testkit.events import membership_event
from pin_testkit.fuzzing import fuzz_examples, fuzz_timeout
from rewards_membership.batch_sql import records_document
from rewards_membership.rules.guard import MembershipRow
from rewards_membership.rules.plan import Outcome, plan_batch
from rewards_membership.rules.validation import (
    InvalidEvent,
    Item,
    MembershipChange,
    idempotency_key,
    position_key,
    validate,
)
from rewards_membership.store import MembershipStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(fuzz_timeout())]

Conn = psycopg.Connection[TupleRow]
RowKey = tuple[uuid.UUID, uuid.UUID]
Scenario = tuple[list[bytes | None], dict[RowKey, MembershipRow], dict[str, str]]

# Small pools, so that records meet: several per row, MessageIds repeated.
AGENTS: Final = [uuid.UUID(int=n, version=4) for n in (1, 2)]
COMPANIES: Final = [uuid.UUID(int=100 + n, version=4) for n in (1, 2)]
PAIRS: Final = [(a, c) for a in AGENTS for c in COMPANIES]
MESSAGE_IDS: Final = [uuid.UUID(int=1000 + n, version=4) for n in range(10)]
TOPIC: Final = "membership-topic"
INBOX_OUTCOMES: Final = [
    "membership-applied",
    "skipped-stale-membership",
    "dead-lettered",
    "dead-letter-resolved",
]

offsets = st.integers(min_value=-14 * 60, max_value=14 * 60).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
instants = st.one_of(
    # Mostly near each other (LastActivityAt's max, equal instants in other offsets) ...
    st.datetimes(
        min_value=datetime(2025, 1, 1),  # noqa: DTZ001 - Hypothesis applies `timezones`
        max_value=datetime(2025, 1, 3),  # noqa: DTZ001
        timezones=offsets,
    ),
    # ... and anywhere the wire and Python can hold.
    st.datetimes(
        min_value=datetime(1, 1, 2),  # noqa: DTZ001
        max_value=datetime(9999, 12, 30),  # noqa: DTZ001
        timezones=offsets,
    ),
)
maybe_instants = st.one_of(st.none(), instants)
versions = st.integers(min_value=1, max_value=6)
statuses = st.sampled_from(["Active", "Left", "Active", "Left", "Suspended", "", "active"])
reasons = st.sampled_from([None, "SelfLeave", "ExcludedByAgency", "Fired", ""])


@st.composite
def event_value(draw: st.DrawFn) -> bytes:
    """A record value: a valid envelope, then its fields replaced on the JSON document."""
    agent, company = draw(st.sampled_from(PAIRS))
    document: dict[str, Any] = msgspec.json.decode(
        encode(envelope_for(membership_event(agent, company, 1)))
    )
    payload = document["Payload"]
    document["MessageId"] = str(draw(st.sampled_from(MESSAGE_IDS)))
    version = draw(versions)
    document["Version"] = payload["Version"] = version
    payload["Status"] = draw(statuses)
    payload["Reason"] = draw(reasons)
    payload["JoinedAt"] = draw(instants).isoformat()
    for name in ("LeftAt", "EffectiveAt"):
        value = draw(maybe_instants)
        payload[name] = None if value is None else value.isoformat()
    if draw(st.integers(min_value=0, max_value=12)) == 0:
        # REWARDS_MEMBERSHIP_EVENT_INVALID with a MessageId: a keyed dead letter.
        payload[draw(st.sampled_from(["AgentUserId", "CompanyId"]))] = str(EMPTY_GUID)
    return msgspec.json.encode(document)


record_values = st.one_of(
    event_value(),
    event_value(),
    event_value(),
    event_value(),
    event_value(),
    # A dead letter without a readable MessageId (keyed by its position).
    st.sampled_from([b"{", b"null", b'{"MessageId": 7}']),
)


@st.composite
def existing_row(draw: st.DrawFn, key: RowKey) -> MembershipRow:
    """A row as it may stand before the batch: any membership state, nulls included."""
    return MembershipRow(
        agent_user_id=key[0],
        company_id=key[1],
        membership_status=draw(st.sampled_from([None, "Active", "Left"])),
        leave_reason=draw(st.sampled_from([None, "SelfLeave", "ExcludedByAgency"])),
        left_at=draw(maybe_instants),
        effective_at=draw(maybe_instants),
        first_activity_at=draw(maybe_instants),
        last_activity_at=draw(maybe_instants),
        last_membership_version=draw(st.integers(min_value=0, max_value=6)),
        version=draw(st.integers(min_value=0, max_value=5)),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """(record values in consume order, rows beforehand, inbox marks beforehand)."""
    values: list[bytes | None] = draw(st.lists(record_values, min_size=1, max_size=12))
    if draw(st.booleans()):
        values.append(None)  # a tombstone: a dead letter keyed by its position
    present = draw(st.lists(st.sampled_from(PAIRS), unique=True))
    rows = {key: draw(existing_row(key)) for key in present}
    keys = [idempotency_key(m) for m in MESSAGE_IDS] + [
        position_key(TOPIC, 0, offset) for offset in range(3)
    ]
    inbox: dict[str, str] = {
        key: draw(st.sampled_from(INBOX_OUTCOMES))
        for key in draw(st.lists(st.sampled_from(keys), unique=True, max_size=5))
    }
    return values, rows, inbox


def batch_items(values: list[bytes | None]) -> list[Item]:
    """Validated as the loop validates: a dead letter without a MessageId keyed by its
    position (record `offset` of partition 0)."""
    items: list[Item] = []
    for offset, value in enumerate(values):
        item = validate(value)
        if isinstance(item, InvalidEvent) and item.key is None:
            item = msgspec.structs.replace(item, key=position_key(TOPIC, 0, offset))
        items.append(item)
    return items


_SEED_ROW = (
    "INSERT INTO rewards.agent_performance (agent_user_id, company_id, membership_status,"
    " leave_reason, left_at, effective_at, first_activity_at, last_activity_at,"
    " last_membership_version, version, deals_closed_count)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 7)"
)
_ROWS = (
    "SELECT agent_user_id, company_id, membership_status, leave_reason, left_at, effective_at,"
    " first_activity_at, last_activity_at, last_membership_version, version"
    " FROM rewards.agent_performance"
)


def seed(db: Conn, rows: dict[RowKey, MembershipRow], inbox: dict[str, str]) -> None:
    with db.cursor() as cursor:
        cursor.executemany(_SEED_ROW, [msgspec.structs.astuple(row) for row in rows.values()])
        cursor.executemany(
            "INSERT INTO rewards.inbox (idempotency_key, outcome) VALUES (%s, %s)",
            list(inbox.items()),
        )


def state(db: Conn) -> tuple[dict[RowKey, MembershipRow], dict[str, str], set[int]]:
    """Rows, inbox marks and the earned metric every row was seeded (or created) with."""
    with db.cursor(row_factory=class_row(MembershipRow)) as cursor:
        rows = {row.key: row for row in cursor.execute(_ROWS)}
    inbox: dict[str, str] = {
        str(key): str(outcome)
        for key, outcome in db.execute("SELECT idempotency_key, outcome FROM rewards.inbox")
    }
    earned = {n for (n,) in db.execute("SELECT deals_closed_count FROM rewards.agent_performance")}
    return rows, inbox, earned


@pytest.fixture
def db(consumer_dsn: str) -> Iterator[Conn]:
    """The consumer's own kind of session (its runtime role, its session settings)."""
    store = MembershipStore(
        consumer_dsn, application_name="test-batch-sql", session=SessionLimits()
    )
    try:
        yield store.connection()
    finally:
        store.close()


def test_the_batch_statement_decides_as_plan_batch(db: Conn) -> None:
    seen: Counter[str] = Counter()

    @settings(
        max_examples=fuzz_examples(),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )
    @given(scenario=scenarios())
    def example(scenario: Scenario) -> None:
        values, rows, inbox = scenario
        items = batch_items(values)
        plan = plan_batch(items, set(inbox), rows)
        expected_rows = dict(rows)
        expected_rows.update((row.key, row) for row in plan.updates + plan.inserts)
        expected_inbox = dict(inbox)
        expected_inbox.update((key, outcome.value) for key, outcome in plan.inbox)

        with db.transaction(force_rollback=True):
            seed(db, rows, inbox)
            outcomes = MembershipStore.apply(db, records_document(items))
            found_rows, found_inbox, earned = state(db)

        assert outcomes == plan.outcomes
        assert found_rows == expected_rows
        assert found_inbox == expected_inbox
        assert earned <= {0, 7}  # earned metrics untouched (7 seeded, 0 for created rows)
        seen.update(outcome.value for outcome in outcomes)
        seen.update(["row updated"] * len(plan.updates) + ["row created"] * len(plan.inserts))
        seen.update(
            "several applied to one row"
            for count in Counter(
                item.row_key
                for item, outcome in zip(items, outcomes, strict=True)
                if isinstance(item, MembershipChange) and outcome is Outcome.APPLIED
            ).values()
            if count > 1
        )
        seen.update(
            "inbox duplicate"
            for item, o in zip(items, outcomes, strict=True)
            if o is Outcome.DUPLICATE and item.key in inbox
        )

    example()
    # The examples reached every outcome and every kind of row change.
    for kind in (
        *(o.value for o in Outcome),
        "row updated",
        "row created",
        "several applied to one row",
        "inbox duplicate",
    ):
        assert seen[kind] > 0, (kind, seen)
