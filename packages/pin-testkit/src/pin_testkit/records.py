"""Records on real topics, read and written as an outside client would.

Reading goes from given offsets (default: the beginning) to the end *as of the call*: the
high watermarks are taken first, so a read ends even while producers keep writing, and a
test never waits for "no more records" (which would need a fixed quiet period).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from pin_contracts import Headers
from pin_runtime.kafka import record_headers

__all__ = [
    "Delivered",
    "Offsets",
    "Record",
    "commit_group_offsets",
    "consume",
    "end_offsets",
    "first_value",
    "produce",
    "read_messages",
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
            "group.id": group or f"pin-test-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )


def end_offsets(bootstrap: str, topic: str, timeout: float = 30.0) -> Offsets:
    """The high watermark of every partition of ``topic`` now."""
    deadline = time.monotonic() + timeout
    consumer = _consumer(bootstrap)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        partitions = sorted(metadata.topics[topic].partitions)
        return {
            p: _high_watermark(consumer, TopicPartition(topic, p), deadline) for p in partitions
        }
    finally:
        consumer.close()


def _high_watermark(consumer: Consumer, partition: TopicPartition, deadline: float) -> int:
    # A topic just created can be led in the metadata before its broker serves it
    # (NOT_LEADER_FOR_PARTITION for a moment): a retriable error is asked again until the
    # deadline, anything else raised at once.
    while True:
        try:
            remaining = max(0.1, deadline - time.monotonic())
            return int(consumer.get_watermark_offsets(partition, timeout=remaining)[1])
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = isinstance(error, KafkaError) and error.retriable()
            if not retriable or time.monotonic() >= deadline:
                raise
        time.sleep(0.05)


def read_messages(
    bootstrap: str,
    topic: str,
    start: Mapping[int, int] | None = None,
    *,
    timeout: float = READ_TIMEOUT,
) -> list[Message]:
    """Every record of ``topic`` from ``start`` (default: the beginning) to the end as of
    now, as the client's messages (partition order within each partition)."""
    ends = end_offsets(bootstrap, topic)
    begin = {p: (start or {}).get(p, 0) for p in ends}
    pending = {p for p in ends if ends[p] > begin[p]}
    messages: list[Message] = []
    if not pending:
        return messages
    consumer = _consumer(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, p, begin[p]) for p in sorted(pending)])
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() >= deadline:
                raise AssertionError(f"{topic}: partitions {pending} not read to the end")
            for message in consumer.consume(num_messages=1000, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise AssertionError(f"{topic}: {error}")
                    continue
                partition, offset = message.partition(), message.offset()
                if partition is None or offset is None or offset >= ends[partition]:
                    continue
                messages.append(message)
                if offset + 1 >= ends[partition]:
                    pending.discard(partition)
    finally:
        consumer.close()
    return messages


def read_topic(bootstrap: str, topic: str, start: Mapping[int, int] | None = None) -> list[Record]:
    """:func:`read_messages` as plain :class:`Record` values."""
    return [_record(topic, message) for message in read_messages(bootstrap, topic, start)]


def _record(topic: str, message: Message) -> Record:
    return Record(
        topic=topic,
        partition=int(message.partition() or 0),
        offset=int(message.offset() or 0),
        key=message.key(),
        value=message.value(),
        headers=record_headers(message),
    )


def consume(
    bootstrap: str, topic: str, count: int, timeout: float = 60.0, *, group_prefix: str = "pin-test"
) -> list[Message]:
    """The first ``count`` records a new consumer group subscribed to ``topic`` receives
    (from the earliest offset); fails unless exactly that many arrive within ``timeout``."""
    consumer = _consumer(bootstrap, f"{group_prefix}-{uuid.uuid4().hex[:8]}")
    received: list[Message] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(received) < count and (remaining := deadline - time.monotonic()) > 0:
            message = consumer.poll(min(remaining, 1.0))
            if message is None:
                continue
            if message.error() is not None:
                raise AssertionError(f"{topic}: {message.error()}")
            received.append(message)
    finally:
        consumer.close()
    if len(received) != count:
        raise AssertionError(f"{len(received)} of {count} records within {timeout}s")
    return received


def commit_group_offsets(
    bootstrap: str, group: str, topic: str, offsets: Mapping[int, int]
) -> None:
    """Set a consumer group's committed positions (``kafka-consumer-groups --reset-offsets``).

    A consumer of a scenario then starts at the scenario's own first record instead of
    re-reading what earlier ones left on a shared topic.
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
    Fails unless every record is acknowledged.

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
    if failures or remaining:
        raise AssertionError(f"produce to {topic}: {failures}, {remaining} not acknowledged")
    return [delivered[i] for i in range(len(records))]


def first_value(consumer: Consumer, topic: str, timeout: float = 30.0) -> bytes:
    """Subscribe ``consumer`` (configured by the caller: a secured client, say) to ``topic``
    and return the value of the first record it receives; closes the consumer. Fails unless
    a record arrives within ``timeout`` and without an error."""
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None:
                if message.error() is not None:
                    raise AssertionError(f"{topic}: {message.error()}")
                return message.value() or b""
    finally:
        consumer.close()
    raise AssertionError(f"{topic}: no record came back within {timeout:g}s")
