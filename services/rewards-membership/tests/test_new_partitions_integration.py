"""Partitions added to the membership topic while the consumer runs (real Kafka, PostgreSQL).

The catalogue fixes the topic at 3 partitions, and identity's relay never writes beyond them;
but a record that does reach a new partition (a producer outside the contract) must not wait
unseen for librdkafka's default metadata refresh (5 minutes): the consumer refreshes every
`pin_runtime.kafka.METADATA_REFRESH_MS` (10 s), and applies it within `BOUND`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
import pytest
from confluent_kafka.cimpl import NewPartitions
from consumer_kit import record_of

from pin_contracts import DeadLetterInfo, envelope_for, key_partition
from pin_runtime.delivery import DeliveryTracker, flush_or_raise
from pin_runtime.kafka import create_admin, create_producer
from rewards_membership.cli import main
from rewards_membership.settings import LagWatchSettings

pytestmark = pytest.mark.integration

BOUND = 30.0
"""Seconds from a record's arrival on a new partition to its being applied: the metadata
refresh (10 s), a rebalance that assigns the partition, and a batch (README "Partitions")."""


def test_a_record_on_a_partition_added_while_running_is_applied_within_the_bound(
    kafka: Any, start_consumer: Any, event: Any, sql: Any, wait: Any
) -> None:
    company = uuid.uuid4()
    first, late = uuid.uuid4(), uuid.uuid4()
    consumer = start_consumer()
    kafka.send(event(first, company, 1))
    consumer.wait_handled(1)  # running, its partitions assigned

    admin = create_admin(kafka.bootstrap, client_id="rewards-membership-test-admin")
    for future in admin.create_partitions([NewPartitions(kafka.topic, 6)]).values():
        future.result(30)
    # A plain producer that knows the new partitions, straight into the last one.
    producer = create_producer(kafka.bootstrap, client_id="rewards-membership-test-grown")
    wait(
        lambda: (
            len(producer.list_topics(kafka.topic, timeout=10).topics[kafka.topic].partitions) == 6
        ),
        30,
        "the producer sees 6 partitions",
    )
    key, value, headers = record_of(envelope_for(event(late, company, 1)))
    tracker = DeliveryTracker[int]()
    producer.produce(
        kafka.topic, key=key, value=value, headers=headers, partition=5, on_delivery=tracker
    )
    flush_or_raise(producer, 30.0, tracker)
    arrived = time.monotonic()

    def applied() -> bool:
        return bool(
            sql(
                "SELECT 1 FROM rewards.agent_performance WHERE agent_user_id = %(agent)s",
                {"agent": late},
            )
        )

    took = wait(applied, BOUND, f"the record on partition 5 applied within {BOUND:g}s")
    assert time.monotonic() - arrived < BOUND
    assert consumer.error is None
    print(f"applied {took:.1f}s after it arrived on a new partition")  # noqa: T201


def test_the_lag_watcher_exports_the_membership_topics_catalogue_count() -> None:
    watch = LagWatchSettings(kafka_bootstrap="k:9092")
    assert watch.catalogue_partitions() == {"pin.identity.agent-membership-changed.v1": 3}


def test_a_replayed_dead_letter_goes_to_its_keys_catalogue_partition_on_a_grown_topic(
    *,
    kafka: Any,
    settings: Any,
    operator_dsn: str,
    sql: Any,
    event: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # An agent whose key librdkafka would put on a new partition of the grown topic.
    agent = next(a for a in iter(uuid.uuid4, None) if key_partition(str(a).encode(), 6) >= 3)
    envelope = envelope_for(event(agent, uuid.uuid4(), 1))
    key, value, headers = record_of(envelope)
    assert key is not None
    info = DeadLetterInfo(
        error_code="REWARDS_MEMBERSHIP_EVENT_INVALID",
        exception_message="$.Payload.Reason: missing",
        exception_fqcn="pin_contracts.errors.ContractViolation",
        original_topic=kafka.topic,
        original_partition=key_partition(key, 3),
        original_offset=0,
        original_timestamp_ms=1_700_000_000_000,
        original_consumer_group=settings.group_id,
    )
    tracker = DeliveryTracker[int]()
    kafka.producer.produce(
        kafka.dlq_topic,
        key=key,
        value=value,
        headers=[*(headers or []), *info.to_headers()],
        partition=0,
        on_delivery=tracker,
    )
    flush_or_raise(kafka.producer, 30.0, tracker)
    inbox_key = f"rewards:identity-membership:{envelope.message_id}"
    sql(
        "INSERT INTO rewards.inbox (idempotency_key, outcome) VALUES (%s, 'dead-lettered')",
        [inbox_key],
    )
    admin = create_admin(kafka.bootstrap, client_id="rewards-membership-test-admin")
    for future in admin.create_partitions([NewPartitions(kafka.topic, 6)]).values():
        future.result(30)
    for name, value in {
        "DATABASE_DSN": operator_dsn,
        "KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TOPIC": settings.topic,
        "DLQ_TOPIC": settings.dlq_topic,
        "GROUP_ID": settings.group_id,
        "DELIVERY_TIMEOUT": "20s",
    }.items():
        monkeypatch.setenv(f"REWARDS_MEMBERSHIP_{name}", value)
    capsys.readouterr()
    assert main(["dlq", "replay", "--all", "--json"]) == 0
    replayed = msgspec.json.decode(capsys.readouterr().out.splitlines()[0])
    assert replayed["result"] == "replayed"
    # Beside the agent's other records (partition CRC32(key) mod 3), not on a new one.
    assert replayed["target_partition"] == key_partition(key, 3)
