"""Reading the topics as an outside consumer would: from given offsets to the current end."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from pin_contracts import Headers

__all__ = [
    "Delivered",
    "Offsets",
    "Record",
    "commit_group_offsets",
    "end_offsets",
    "produce",
    "read_topic",
]

Offsets = dict[int, int]
READ_TIMEOUT: Final = 120.0


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers


def _consumer(bootstrap: str, group: str | None = None) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group or f"pin-e2e-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )


def end_offsets(bootstrap: str, topic: str, timeout: float = 30.0) -> Offsets:
    """The high watermark of every partition of ``topic`` now."""
    consumer = _consumer(bootstrap)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        partitions = sorted(metadata.topics[topic].partitions)
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1])
            for p in partitions
        }
    finally:
        consumer.close()


def read_topic(bootstrap: str, topic: str, start: Mapping[int, int] | None = None) -> list[Record]:
    """Every record of ``topic`` from ``start`` (default: the beginning) to the end as of now."""
    ends = end_offsets(bootstrap, topic)
    begin = {p: (start or {}).get(p, 0) for p in ends}
    pending = {p for p in ends if ends[p] > begin[p]}
    records: list[Record] = []
    if not pending:
        return records
    consumer = _consumer(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, p, begin[p]) for p in sorted(pending)])
        deadline = time.monotonic() + READ_TIMEOUT
        while pending:
            assert time.monotonic() < deadline, f"{topic}: partitions {pending} not read to the end"
            for message in consumer.consume(num_messages=1000, timeout=1.0):
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    continue
                partition, offset = message.partition(), message.offset()
                assert partition is not None
                assert offset is not None
                if offset >= ends[partition]:
                    continue
                raw_headers: Any = message.headers() or []
                records.append(
                    Record(
                        topic=topic,
                        partition=partition,
                        offset=offset,
                        key=message.key(),
                        value=message.value(),
                        headers=[(str(k), v) for k, v in raw_headers],
                    )
                )
                if offset + 1 >= ends[partition]:
                    pending.discard(partition)
    finally:
        consumer.close()
    return records


def commit_group_offsets(
    bootstrap: str, group: str, topic: str, offsets: Mapping[int, int]
) -> None:
    """Set a consumer group's committed positions (``kafka-consumer-groups --reset-offsets``).

    Each scenario's rewards consumer starts at the scenario's own first record instead of
    re-reading the membership events every earlier scenario left on the shared topic.
    """
    consumer = _consumer(bootstrap, group)
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in sorted(offsets.items())],
            asynchronous=False,
        )
    finally:
        consumer.close()


@dataclass(frozen=True, slots=True)
class Delivered:
    partition: int
    offset: int
    timestamp_ms: int


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes | None, Headers]],
    *,
    partition: int | None = None,
    max_message_bytes: int | None = None,
) -> list[Delivered]:
    """Produce raw records (key, value, headers); where the broker stored each, in order.

    `max_message_bytes` raises the client's limit on a record (librdkafka's default is
    1,000,000 bytes) to let a record up to the topic's own limit through.
    """
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0}
    if max_message_bytes is not None:
        config["message.max.bytes"] = max_message_bytes
    producer = Producer(config)
    failures: list[str] = []
    delivered: dict[int, Delivered] = {}

    def on_delivery(index: int) -> Any:
        def callback(error: KafkaError | None, message: Any) -> None:
            if error is not None:
                failures.append(str(error))
            else:
                delivered[index] = Delivered(
                    int(message.partition()), int(message.offset()), int(message.timestamp()[1])
                )

        return callback

    for index, (key, value, headers) in enumerate(records):
        kwargs: dict[str, Any] = {"key": key, "value": value, "headers": headers}
        if partition is not None:
            kwargs["partition"] = partition
        producer.produce(topic, on_delivery=on_delivery(index), **kwargs)
    remaining = producer.flush(30)
    assert not failures, f"produce to {topic}: {failures}"
    assert remaining == 0, f"produce to {topic}: {remaining} records not acknowledged"
    return [delivered[i] for i in range(len(records))]
