"""The dead-letter topic: writing invalid records, reading them back, replaying them.

A dead-lettered record keeps the original key, value and headers byte for byte, goes to
the same partition number, and carries Spring Kafka's `kafka_dlt-*` headers after them
(`pin_contracts.DeadLetterInfo`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    Message,
    Producer,
    TopicPartition,
)

from pin_contracts import (
    DLT_EXCEPTION_FQCN_HEADER,
    DLT_EXCEPTION_MESSAGE_HEADER,
    DLT_ORIGINAL_CONSUMER_GROUP_HEADER,
    DLT_ORIGINAL_OFFSET_HEADER,
    DLT_ORIGINAL_PARTITION_HEADER,
    DLT_ORIGINAL_TIMESTAMP_HEADER,
    DLT_ORIGINAL_TIMESTAMP_TYPE_HEADER,
    DLT_ORIGINAL_TOPIC_HEADER,
    ERROR_CODE_HEADER,
    ERROR_PATH_HEADER,
    ContractViolation,
    DeadLetterInfo,
    Headers,
)
from pin_runtime.delivery import DeliveryTracker, flush_or_raise
from rewards_membership.records import headers_of, offset_of, partition_of, topic_of
from rewards_membership.validation import InvalidEvent

__all__ = [
    "DLQ_HEADERS",
    "DeadLetterRecord",
    "dead_letter_info",
    "read_dead_letters",
    "replay",
]

DLQ_HEADERS: Final = frozenset(
    {
        DLT_EXCEPTION_FQCN_HEADER,
        DLT_EXCEPTION_MESSAGE_HEADER,
        DLT_ORIGINAL_CONSUMER_GROUP_HEADER,
        DLT_ORIGINAL_OFFSET_HEADER,
        DLT_ORIGINAL_PARTITION_HEADER,
        DLT_ORIGINAL_TIMESTAMP_HEADER,
        DLT_ORIGINAL_TIMESTAMP_TYPE_HEADER,
        DLT_ORIGINAL_TOPIC_HEADER,
        ERROR_CODE_HEADER,
        ERROR_PATH_HEADER,
    }
)


def dead_letter_info(message: Message, invalid: InvalidEvent, group_id: str) -> DeadLetterInfo:
    timestamp_type, timestamp_ms = message.timestamp()
    return DeadLetterInfo(
        error_code=invalid.error_code,
        exception_message=invalid.message,
        exception_fqcn=invalid.exception_fqcn,
        original_topic=topic_of(message),
        original_partition=partition_of(message),
        original_offset=offset_of(message),
        original_timestamp_ms=max(timestamp_ms, 0),
        original_timestamp_type=(
            "LogAppendTime" if timestamp_type == TIMESTAMP_LOG_APPEND_TIME else "CreateTime"
        ),
        original_consumer_group=group_id,
        error_path=invalid.path,
    )


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    info: DeadLetterInfo | None
    """None when the DLQ headers are missing or malformed (see `problem`)."""
    problem: str | None = None

    @property
    def original_headers(self) -> Headers:
        """The headers the record had before it was dead-lettered."""
        return [(k, v) for k, v in self.headers if k not in DLQ_HEADERS]


def read_dead_letters(
    consumer: Consumer, topic: str, *, timeout: float
) -> Iterator[DeadLetterRecord]:
    """Every record of `topic` from the beginning to the current end, partition by partition.

    Assigns partitions directly (no group membership, nothing committed).
    """
    metadata = consumer.list_topics(topic, timeout=timeout)
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        raise ContractViolation(topic, "topic does not exist")
    ends: dict[int, int] = {}
    for partition in sorted(described.partitions):
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout
        )
        if high > low:
            ends[partition] = high
    if not ends:
        return
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    try:
        while ends:
            message = consumer.poll(timeout)
            if message is None:
                raise TimeoutError(f"no record from {topic} within {timeout}s")
            if message.error() is not None:
                continue
            partition, offset = partition_of(message), offset_of(message)
            if partition not in ends:
                continue
            if offset + 1 >= ends[partition]:
                del ends[partition]
            headers = headers_of(message)
            try:
                info: DeadLetterInfo | None = DeadLetterInfo.from_headers(headers)
                problem = None
            except ContractViolation as exc:
                info, problem = None, str(exc)
            yield DeadLetterRecord(
                partition, offset, message.key(), message.value(), headers, info, problem
            )
    finally:
        consumer.unassign()


def replay(
    producer: Producer,
    records: Sequence[DeadLetterRecord],
    *,
    default_topic: str,
    delivery_timeout: float,
    on_sent: Callable[[DeadLetterRecord], None] | None = None,
) -> int:
    """Republish records to their original topic (key, value, original headers); flush."""
    tracker = DeliveryTracker[int]()
    for record in records:
        topic = record.info.original_topic if record.info is not None else default_topic
        producer.produce(
            topic,
            key=record.key,
            value=record.value,
            headers=record.original_headers,
            on_delivery=tracker,
        )
        producer.poll(0)
        if on_sent is not None:
            on_sent(record)
    flush_or_raise(producer, delivery_timeout, tracker)
    return tracker.delivered
