"""Kafka failures on the consumer's path: a failed DLQ write, and the broker going away.

Either way the batch's offsets are not committed, its partitions are paused and retried with
backoff, and once Kafka is back every record ends applied once or in the DLQ.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from confluent_kafka import Producer
from consumer_kit import publish

from pin_contracts import encode, envelope_for
from pin_runtime.kafka import create_admin, create_consumer, create_producer, ensure_topics
from pin_testkit.private import PrivateKafka
from rewards_membership.dlq.topic import read_dead_letters

pytestmark = pytest.mark.integration

Event = Callable[..., Any]


def _producer(bootstrap: str) -> Producer:
    """A producer for one phase of the stream (the records after the restart go out on a
    client of their own, not one that saw the broker go)."""
    return create_producer(bootstrap, client_id="outage-test", linger_ms=1)


def test_failed_dlq_write_pauses_and_retries_until_the_dead_letter_lands(
    *, kafka: Any, start_consumer: Any, event: Event, states: Any, wait: Any
) -> None:
    # The DLQ topic does not exist yet and the broker does not create topics: every DLQ
    # write fails until an operator creates it.
    dlq_topic = f"pin-test.dlq-missing.{uuid.uuid4().hex[:8]}"
    consumer = start_consumer(dlq_topic=dlq_topic, delivery_timeout=timedelta(seconds=2))
    agent, company = uuid.uuid4(), uuid.uuid4()
    bad = msgspec.json.decode(encode(envelope_for(event(agent, company, 2))))
    bad["Payload"]["AgentUserId"] = "00000000-0000-0000-0000-000000000000"
    kafka.send(event(agent, company, 1))
    kafka.send_raw((str(agent).encode(), msgspec.json.encode(bad), None))
    kafka.send(event(agent, company, 3, "Left", reason="SelfLeave"))

    wait(
        lambda: consumer.value("rewards_membership_retries_total", dependency="kafka") >= 1,
        what="the failed DLQ write is retried",
    )
    assert consumer.consumer.kafka_state().status == "degraded"

    ensure_topics(create_admin(kafka.bootstrap, client_id="outage-test"), [(dlq_topic, 3)])
    consumer.wait_handled(3, timeout=90)
    wait(lambda: consumer.consumer.kafka_state().status == "ok", what="ready again")

    reader = create_consumer(kafka.bootstrap, group_id="dlq-reader", client_id="t")
    try:
        letters = list(read_dead_letters(reader, dlq_topic, timeout=10))
    finally:
        reader.close()
    assert len(letters) == 1
    assert letters[0].info is not None
    assert letters[0].info.original_topic == kafka.topic
    assert letters[0].key == str(agent).encode()
    # Applied once each, in order: the Left of version 3 is the row's state.
    assert states() == [("Left", 3, 2)]


def test_broker_outage_mid_stream_loses_and_duplicates_nothing(
    *,
    private_kafka: PrivateKafka,
    start_consumer: Any,
    event: Event,
    sql: Any,
    wait: Any,
) -> None:
    topic = private_kafka.create_topic(partitions=3)
    dlq = private_kafka.create_topic(partitions=3)
    consumer = start_consumer(
        kafka_bootstrap=private_kafka.bootstrap,
        topic=topic,
        dlq_topic=dlq,
        delivery_timeout=timedelta(seconds=3),
    )
    company = uuid.uuid4()
    agents = [uuid.uuid4() for _ in range(30)]
    first = [event(a, company, 1) for a in agents]
    second = [event(a, company, 2, "Left", reason="ExcludedByAgency") for a in agents]
    publish(_producer(private_kafka.bootstrap), topic, *first)
    consumer.wait_handled(len(first))

    private_kafka.stop()
    private_kafka.start()
    publish(_producer(private_kafka.bootstrap), topic, *second)

    consumer.wait_handled(len(first) + len(second), timeout=120)
    assert consumer.total("rewards_membership_applied_total") == len(first) + len(second)
    rows = sql(
        "SELECT membership_status, leave_reason, last_membership_version, version "
        "FROM rewards.agent_performance"
    )
    assert sorted(rows) == [("Left", "ExcludedByAgency", 2, 2)] * len(agents)
    (inbox,) = sql("SELECT count(*) FROM rewards.inbox")[0]
    assert inbox == len(first) + len(second)
