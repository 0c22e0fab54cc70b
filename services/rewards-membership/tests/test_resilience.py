"""Bad records, a PostgreSQL outage, a rebalance: nothing lost, nothing applied twice."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict

from pin_contracts import AgentMembershipChanged, DeadLetterInfo, encode, envelope_for
from pin_runtime.kafka import create_consumer
from rewards_membership.dlq.topic import read_dead_letters
from rewards_membership.settings import Settings

pytestmark = pytest.mark.integration

T0 = datetime(2025, 1, 1, tzinfo=UTC)
Event = Callable[..., AgentMembershipChanged]
Sql = Callable[..., list[tuple[Any, ...]]]
Stream = Callable[..., list[AgentMembershipChanged]]


def in_order(payloads: list[AgentMembershipChanged], part: int, of: int) -> list[Any]:
    """The `part`-th of `of` slices of each agent's events (keeps per-key order across sends)."""
    by_agent: dict[uuid.UUID, list[AgentMembershipChanged]] = {}
    for p in payloads:
        by_agent.setdefault(p.agent_user_id, []).append(p)
    chosen = []
    for events in by_agent.values():
        size = len(events) // of
        chosen += events[part * size : (part + 1) * size]
    return chosen


def test_malformed_records_go_to_dlq_and_the_stream_continues(
    kafka: Any, start_consumer: Any, event: Event, sql: Sql, settings: Settings
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    key = str(agent).encode()
    wrong_types = msgspec.json.decode(encode(envelope_for(event(agent, company, 2))))
    wrong_types["Payload"]["CompanyId"] = 42
    consumer = start_consumer()
    kafka.send_raw(
        (key, encode(envelope_for(event(agent, company, 1))), None),
        (key, b"\x00\xffnot json at all", [("x-origin", b"fuzz")]),
        (key, msgspec.json.encode(wrong_types), None),
        (key, None, None),  # a tombstone
        (key, encode(envelope_for(event(agent, company, 3, "Left", reason="SelfLeave"))), None),
    )
    consumer.wait_handled(5)
    assert consumer.total("rewards_identity_membership_dlq_total") == 3
    assert consumer.value("rewards_membership_applied_total", status="Active") == 1
    assert consumer.value("rewards_membership_applied_total", status="Left") == 1
    [(status, version)] = sql(
        "SELECT membership_status, last_membership_version FROM rewards.agent_performance"
    )
    assert (status, version) == ("Left", 3)

    reader = create_consumer(settings.kafka_bootstrap, group_id="dlq-reader", client_id="t")
    try:
        records = list(read_dead_letters(reader, settings.dlq_topic, timeout=10))
    finally:
        reader.close()
    assert [r.value for r in records] == [
        b"\x00\xffnot json at all",
        msgspec.json.encode(wrong_types),
        None,
    ]
    assert all(r.key == key for r in records)
    infos = [r.info for r in records]
    assert all(isinstance(i, DeadLetterInfo) for i in infos)
    assert [i.original_offset for i in infos if i] == [1, 2, 3]
    assert [i.error_path for i in infos if i][1] == "$.Payload.CompanyId"
    assert records[0].original_headers == [("x-origin", b"fuzz")]
    assert all(i.exception_fqcn == "pin_contracts.errors.ContractViolation" for i in infos if i)


def test_postgres_outage_mid_stream_loses_and_duplicates_nothing(
    *,
    kafka: Any,
    start_consumer: Any,
    database: str,
    postgres_admin_dsn: str,
    wait: Callable[..., None],
    stream: Stream,
    assert_applied_once_each: Callable[..., None],
) -> None:
    payloads = stream(agents=30, versions=4)
    name = str(conninfo_to_dict(database)["dbname"])
    consumer = start_consumer()
    kafka.send(*in_order(payloads, 0, 2))
    consumer.wait_handled(len(payloads) // 2)

    with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
        admin.execute(
            pgsql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(pgsql.Identifier(name))
        )
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        try:
            kafka.send(*in_order(payloads, 1, 2))
            wait(
                lambda: (
                    consumer.consumer.database_state().status == "degraded"
                    and consumer.value("rewards_membership_retries_total", dependency="postgresql")
                    >= 2
                ),
                what="consumer notices the outage and keeps retrying",
            )
            assert consumer.handled == len(payloads) // 2
        finally:
            admin.execute(
                pgsql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(pgsql.Identifier(name))
            )
    consumer.wait_handled(len(payloads))
    wait(lambda: consumer.consumer.database_state().status == "ok", what="ready again")
    assert consumer.total("rewards_membership_applied_total") == len(payloads)
    assert consumer.consumer.paused_partitions == frozenset()
    assert_applied_once_each(payloads)


def test_second_consumer_joining_loses_and_duplicates_nothing(
    kafka: Any,
    start_consumer: Any,
    wait: Callable[..., None],
    stream: Stream,
    assert_applied_once_each: Callable[..., None],
) -> None:
    payloads = stream(agents=40, versions=6)
    first = start_consumer()
    kafka.send(*in_order(payloads, 0, 3))
    first.wait_handled(len(payloads) // 3)
    second = start_consumer()
    kafka.send(*in_order(payloads, 1, 3))
    wait(
        lambda: (
            bool(second.consumer.assigned_partitions)
            and len(first.consumer.assigned_partitions) < 3
        ),
        what="the group rebalanced onto both consumers",
    )
    kafka.send(*in_order(payloads, 2, 3))
    wait(
        lambda: first.handled + second.handled >= len(payloads),
        what="all messages handled by the two consumers",
    )
    applied = first.total("rewards_membership_applied_total") + second.total(
        "rewards_membership_applied_total"
    )
    assert applied == len(payloads)
    assert first.handled + second.handled == len(payloads)  # no redelivery at all
    assert_applied_once_each(payloads)
