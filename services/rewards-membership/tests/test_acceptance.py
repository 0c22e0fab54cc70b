"""Every acceptance criterion of the spec, on real PostgreSQL and real Kafka."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from pin_contracts import (
    DLT_ORIGINAL_CONSUMER_GROUP_HEADER,
    AgentMembershipChanged,
    DeadLetterInfo,
    envelope_for,
    kafka_key,
)
from pin_runtime.kafka import create_consumer
from rewards_membership.dlq.topic import read_dead_letters
from rewards_membership.rules.display import display_status
from rewards_membership.settings import Settings

pytestmark = pytest.mark.integration

T0 = datetime(2025, 1, 1, tzinfo=UTC)
EARNED = {
    "deals_closed_count": 7,
    "fixations_count": 3,
    "commission_accrued_amount": Decimal("1234.50"),
    "commission_paid_amount": Decimal("1000.00"),
}
Event = Callable[..., AgentMembershipChanged]
Rows = Callable[..., list[dict[str, Any]]]
Sql = Callable[..., list[tuple[Any, ...]]]


def seed(sql: Sql, agent: uuid.UUID, company: uuid.UUID, status: str, version: int) -> None:
    sql(
        "INSERT INTO rewards.agent_performance (agent_user_id, company_id, membership_status,"
        " first_activity_at, last_activity_at, last_membership_version, version,"
        " deals_closed_count, fixations_count, commission_accrued_amount,"
        " commission_paid_amount) VALUES (%(a)s, %(c)s, %(s)s, %(t)s, %(t)s, %(v)s, %(v)s,"
        " %(deals_closed_count)s, %(fixations_count)s, %(commission_accrued_amount)s,"
        " %(commission_paid_amount)s)",
        {"a": agent, "c": company, "s": status, "t": T0, "v": version, **EARNED},
    )


def earned(row: dict[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in EARNED}


def one(rows: Rows, agent: uuid.UUID, company: uuid.UUID) -> dict[str, Any]:
    found = rows("agent_user_id = %(a)s AND company_id = %(c)s", {"a": agent, "c": company})
    assert len(found) == 1
    return found[0]


def test_join_active(kafka: Any, start_consumer: Any, event: Event, rows: Rows, sql: Sql) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    seed(sql, agent, company, "Left", 1)
    sql(
        "UPDATE rewards.agent_performance SET leave_reason = 'SelfLeave', left_at = %(t)s,"
        " effective_at = %(t)s WHERE agent_user_id = %(a)s",
        {"t": T0, "a": agent},
    )
    joined = T0 + timedelta(days=5)
    consumer = start_consumer()
    kafka.send(event(agent, company, 2, "Active", joined_at=joined))
    consumer.wait_handled(1)
    row = one(rows, agent, company)
    assert row["membership_status"] == "Active"
    assert (row["leave_reason"], row["left_at"], row["effective_at"]) == (None, None, None)
    assert row["first_activity_at"] == T0  # ??= kept the existing one
    assert row["last_activity_at"] == joined  # max(.., JoinedAt)
    assert row["last_membership_version"] == 2
    assert row["version"] == 2  # += 1
    assert earned(row) == EARNED
    assert consumer.value("rewards_membership_applied_total", status="Active") == 1


@pytest.mark.parametrize("reason", ["SelfLeave", "ExcludedByAgency"])
def test_leave_with_reason(
    *, kafka: Any, start_consumer: Any, event: Event, rows: Rows, sql: Sql, reason: str
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    seed(sql, agent, company, "Active", 1)
    left_at, effective_at = T0 + timedelta(days=3), T0 + timedelta(days=33)
    consumer = start_consumer()
    kafka.send(
        event(agent, company, 2, "Left", reason=reason, left_at=left_at, effective_at=effective_at)
    )
    consumer.wait_handled(1)
    row = one(rows, agent, company)
    assert row["membership_status"] == "Left"
    assert row["leave_reason"] == reason
    assert (row["left_at"], row["effective_at"]) == (left_at, effective_at)
    assert row["last_activity_at"] == left_at
    assert earned(row) == EARNED  # earned metrics survive the leave
    assert consumer.value("rewards_membership_applied_total", status="Left") == 1


def test_multi_membership_other_rows_untouched(
    kafka: Any, start_consumer: Any, event: Event, rows: Rows, sql: Sql
) -> None:
    agent, agency_a, agency_b = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    seed(sql, agent, agency_a, "Active", 1)
    seed(sql, agent, agency_b, "Active", 1)
    before_b = one(rows, agent, agency_b)
    consumer = start_consumer()
    kafka.send(event(agent, agency_a, 2, "Left", reason="SelfLeave", left_at=T0))
    consumer.wait_handled(1)
    assert one(rows, agent, agency_a)["membership_status"] == "Left"
    assert one(rows, agent, agency_b) == before_b  # not even updated_at moved
    agent_rows = rows("agent_user_id = %(a)s", {"a": agent})
    status = display_status((r["company_id"], r["membership_status"]) for r in agent_rows)
    assert status == f"in agency {agency_b}"


def test_two_actives_in_a_row(kafka: Any, start_consumer: Any, event: Event, rows: Rows) -> None:
    agent, agency_a, agency_b = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    consumer = start_consumer()
    kafka.send(event(agent, agency_a, 1), event(agent, agency_b, 1))
    consumer.wait_handled(2)
    found = rows("agent_user_id = %(a)s", {"a": agent})
    assert {r["company_id"]: r["membership_status"] for r in found} == {
        agency_a: "Active",
        agency_b: "Active",
    }


def test_lazy_creation_with_zero_metrics(
    kafka: Any, start_consumer: Any, event: Event, rows: Rows
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    consumer = start_consumer()
    kafka.send(event(agent, company, 4, "Active", joined_at=T0))
    consumer.wait_handled(1)
    row = one(rows, agent, company)
    assert row["membership_status"] == "Active"
    assert row["first_activity_at"] == row["last_activity_at"] == T0
    assert row["last_membership_version"] == 4
    assert row["version"] == 1
    assert earned(row) == dict.fromkeys(EARNED, 0)


def test_stale_event_does_not_roll_back(
    kafka: Any, start_consumer: Any, event: Event, rows: Rows, sql: Sql
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    seed(sql, agent, company, "Active", 5)
    before = one(rows, agent, company)
    consumer = start_consumer()
    envelopes = kafka.send(
        event(agent, company, 5, "Left", reason="SelfLeave", left_at=T0),
        event(agent, company, 3, "Left", reason="SelfLeave", left_at=T0),
    )
    consumer.wait_handled(2)
    assert one(rows, agent, company) == before
    assert consumer.value("rewards_membership_skipped_stale_total") == 2
    keys = sql("SELECT idempotency_key, outcome FROM rewards.inbox ORDER BY 1")
    assert sorted(keys) == sorted(
        (f"rewards:identity-membership:{e.message_id}", "skipped-stale-membership")
        for e in envelopes
    )


def test_duplicate_delivery_is_skipped(
    kafka: Any, start_consumer: Any, event: Event, rows: Rows
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    envelope = envelope_for(event(agent, company, 1))
    consumer = start_consumer()
    kafka.send_envelopes(envelope, envelope)
    consumer.wait_handled(2)
    kafka.send_envelopes(envelope)
    consumer.wait_handled(3)
    assert consumer.value("rewards_membership_skipped_duplicate_total") == 2
    assert consumer.value("rewards_membership_applied_total", status="Active") == 1
    assert one(rows, agent, company)["version"] == 1


def test_unknown_status_fails_closed(
    *,
    kafka: Any,
    start_consumer: Any,
    event: Event,
    raw: Callable[..., bytes],
    rows: Rows,
    sql: Sql,
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    seed(sql, agent, company, "Active", 1)
    consumer = start_consumer()
    kafka.send_raw((str(agent).encode(), raw(event(agent, company, 2, "Suspended")), None))
    consumer.wait_handled(1)
    assert one(rows, agent, company)["membership_status"] == "Left"
    assert consumer.value("rewards_membership_unknown_status_total") == 1
    assert earned(one(rows, agent, company)) == EARNED


def test_unknown_reason_degrades_softly(
    kafka: Any, start_consumer: Any, event: Event, raw: Callable[..., bytes], rows: Rows
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    consumer = start_consumer()
    left = event(agent, company, 2, "Left", reason="Retired", left_at=T0)
    kafka.send_raw((str(agent).encode(), raw(left), None))
    consumer.wait_handled(1)
    row = one(rows, agent, company)
    assert (row["membership_status"], row["leave_reason"], row["left_at"]) == ("Left", None, T0)
    assert consumer.value("rewards_membership_unknown_reason_total") == 1


def test_contract_version_mismatch_warns_and_proceeds(
    kafka: Any, start_consumer: Any, event: Event, raw: Callable[..., bytes], rows: Rows
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    consumer = start_consumer()
    kafka.send_raw((str(agent).encode(), raw(event(agent, company, 1), ContractVersion=2), None))
    consumer.wait_handled(1)
    assert one(rows, agent, company)["membership_status"] == "Active"
    assert consumer.value("rewards_contract_mismatch_total", contract_version="2") == 1
    # Versions a producer invents do not grow the label set: they count as "other".
    weird = [(uuid.uuid4(), 17), (uuid.uuid4(), 2**31 - 1), (uuid.uuid4(), 900)]
    for other, version in weird:
        kafka.send_raw(
            (str(other).encode(), raw(event(other, company, 1), ContractVersion=version), None)
        )
    consumer.wait_handled(1 + len(weird))
    assert consumer.value("rewards_contract_mismatch_total", contract_version="other") == 3
    counts = {
        sample.labels["contract_version"]: sample.value
        for metric in consumer.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "rewards_contract_mismatch_total"
    }
    # The label set stays the bounded one exported from the start (each at 0 until used).
    assert set(counts) == {str(v) for v in range(2, 17)} | {"other"}
    assert {label for label, value in counts.items() if value} == {"2", "other"}


def dead_letters(settings: Settings) -> list[Any]:
    consumer = create_consumer(
        settings.kafka_bootstrap, group_id="dlq-reader", client_id="dlq-reader-test"
    )
    try:
        return list(read_dead_letters(consumer, settings.dlq_topic, timeout=10))
    finally:
        consumer.close()


@pytest.mark.parametrize("empty", ["AgentUserId", "CompanyId"])
def test_contract_violation_goes_to_dlq_with_headers(
    *, kafka: Any, start_consumer: Any, event: Event, rows: Rows, settings: Settings, empty: str
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    nil = uuid.UUID(int=0)
    bad = event(
        nil if empty == "AgentUserId" else agent,
        nil if empty == "CompanyId" else company,
        1,
        membership_id=uuid.uuid4(),
    )
    consumer = start_consumer()
    [sent] = kafka.send(bad)
    consumer.wait_handled(1)
    assert (
        consumer.value(
            "rewards_identity_membership_dlq_total", code="REWARDS_MEMBERSHIP_EVENT_INVALID"
        )
        == 1
    )
    assert rows() == []
    [record] = dead_letters(settings)
    assert record.key == kafka_key(sent)
    info = record.info
    assert isinstance(info, DeadLetterInfo)
    assert info.error_code == "REWARDS_MEMBERSHIP_EVENT_INVALID"
    assert info.error_path == f"$.Payload.{empty}"
    assert info.original_topic == settings.topic
    assert info.original_consumer_group == settings.group_id
    assert info.original_offset == 0
    assert info.original_timestamp_ms > 0
    assert any(name == DLT_ORIGINAL_CONSUMER_GROUP_HEADER for name, _ in record.headers)
    assert ("pin-message-id", str(sent.message_id).encode()) in record.headers


def test_replay_from_offset_zero_converges(
    *, kafka: Any, start_consumer: Any, event: Event, rows: Rows, sql: Sql, settings: Settings
) -> None:
    agents = [uuid.uuid4() for _ in range(5)]
    agencies = [uuid.uuid4() for _ in range(2)]
    payloads = []
    for agent in agents:
        for agency in agencies:
            payloads += [
                event(agent, agency, 1),
                event(agent, agency, 2, "Left", reason="SelfLeave", left_at=T0),
                event(agent, agency, 3, joined_at=T0 + timedelta(days=1)),
                event(agent, agency, 4, "Left", reason="ExcludedByAgency", left_at=T0),
            ]
    first = start_consumer()
    kafka.send(*payloads)
    first.wait_handled(len(payloads))
    first.close()
    state = rows()
    # Replay from offset 0 with the inbox pruned: only the version guard protects the rows.
    sql("DELETE FROM rewards.inbox")
    again = start_consumer(group_id=settings.group_id + "-replay")
    again.wait_handled(len(payloads))
    assert again.value("rewards_membership_skipped_stale_total") == len(payloads)
    assert rows() == state
    assert all(r["membership_status"] == "Left" for r in state)
    assert all(r["leave_reason"] == "ExcludedByAgency" for r in state)
    assert all(r["last_membership_version"] == 4 for r in state)
