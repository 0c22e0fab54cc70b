"""`pin_contracts.key_partition` is the choice librdkafka's default partitioner makes.

The outbox relay names each record's partition itself (by the catalogue's count); a key it
put anywhere else than librdkafka did before would reach a new partition at the upgrade,
behind records of the same key still on the old one.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, Message

from pin_contracts import AGENT_MEMBERSHIP_CHANGED, USER_ACCESS_CHANGED, key_partition
from pin_runtime.kafka import create_producer

pytestmark = pytest.mark.integration

KEYS = 2000


@pytest.mark.parametrize(
    "partitions",
    sorted({USER_ACCESS_CHANGED.partitions, AGENT_MEMBERSHIP_CHANGED.partitions, 6}),
)
def test_key_partition_agrees_with_librdkafka_default_partitioner(
    kafka_bootstrap: str, kafka_topic: Callable[..., str], partitions: int
) -> None:
    topic = kafka_topic(partitions=partitions)
    # Producer defaults only (no partitioner set): what the relay produced with before.
    producer = create_producer(kafka_bootstrap, client_id="pin-runtime-test-partitioner")
    keys = [str(uuid.uuid4()).encode() for _ in range(KEYS)]
    chosen: dict[bytes, int] = {}

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        assert error is None, error
        key, partition = message.key(), message.partition()
        assert key is not None
        assert partition is not None
        chosen[key] = partition

    for key in keys:
        producer.produce(topic, key=key, value=b"{}", on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert len(chosen) == KEYS
    assert len(set(chosen.values())) == partitions  # every partition was chosen for some key
    ours = {key: key_partition(key, partitions) for key in chosen}
    assert {k: (v, ours[k]) for k, v in chosen.items() if v != ours[k]} == {}
