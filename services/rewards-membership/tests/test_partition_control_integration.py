"""PartitionControl on a real consumer: a partition paused a moment after its assignment.

After a rebalance (the broker restarted, the group moved) a batch can fail before the fetch
of a just-assigned partition has started. The client then refuses the seek back
(`_STATE`, "Erroneous state") although it holds the partition paused: a pause not known to
the pauser would never be resumed, and the partition would stay silent until the next
rebalance while its events wait unapplied.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from prometheus_client import CollectorRegistry

from pin_runtime.kafka import create_producer
from pin_testkit.waiting import wait_until
from rewards_membership.consumer.partitions import PartitionControl, PartitionPauser
from rewards_membership.metrics import Metrics

pytestmark = pytest.mark.integration

RECORDS = 10
FAILED_FROM = 5  # the failed batch's first offset: where the partition is read again


def test_a_partition_paused_right_after_its_assignment_is_resumed_where_it_was_sought(
    kafka_bootstrap: str, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic(partitions=1)
    producer = create_producer(kafka_bootstrap, client_id="partition-control-test")
    for n in range(RECORDS):
        producer.produce(topic, key=b"agent", value=str(n).encode(), partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"partition-control-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    now = [0.0]
    control = PartitionControl(
        consumer,
        topic=topic,
        pauser=PartitionPauser(initial=1.0, maximum=1.0),
        metrics=Metrics(CollectorRegistry()),
        clock=lambda: now[0],
    )
    try:
        control.on_assign(consumer, [TopicPartition(topic, 0)])
        # What a failed batch does at once (its offsets' commit refused): this client
        # refuses the seek of a partition whose fetch has not started yet.
        with pytest.raises(KafkaException, match="Erroneous state"):
            consumer.seek(TopicPartition(topic, 0, FAILED_FROM))
        control.pause(
            {0: FAILED_FROM},
            dependency="kafka",
            reason="KafkaException: the offset commit was refused",
            event="batch rolled back, partitions paused",
        )
        assert control.pauser.is_paused(0), "the client holds it paused: so must the pauser"
        assert _records(consumer, timeout=1.0) == []  # paused: nothing is fetched

        now[0] += 1.0  # the backoff has passed
        control.resume_due(lambda: True)
        assert not control.pauser.is_paused(0)
        read: list[int | None] = []

        def read_again() -> bool:
            read.extend(m.offset() for m in _records(consumer, timeout=0.5))
            return len(read) >= RECORDS - FAILED_FROM

        wait_until(
            read_again, timeout=30, what="the resumed partition read again from the failed batch"
        )
        assert read == list(range(FAILED_FROM, RECORDS))
    finally:
        consumer.close()


def _records(consumer: Consumer, *, timeout: float) -> list[Message]:
    return [m for m in consumer.consume(num_messages=100, timeout=timeout) if m.error() is None]
