"""The dead-letter topic: writing invalid records, reading them back, replaying them.

A dead-lettered record keeps the original key, value and headers byte for byte, goes to
the same partition number, and carries Spring Kafka's `kafka_dlt-*` headers after them
(`pin_contracts.DeadLetterInfo`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, NamedTuple, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    Message,
    TopicPartition,
)

from pin_contracts import (
    DLT_VALUE_REPLACED_HEADER,
    ContractViolation,
    DeadLetterInfo,
    Headers,
    Unreadable,
    original_headers,
)
from pin_runtime.kafka import read_headers
from rewards_membership.dlq.reference import decode_reference, sha256_hex
from rewards_membership.errors import TopicMissingError
from rewards_membership.records import offset_of, partition_of, topic_of
from rewards_membership.rules.validation import InvalidEvent

__all__ = [
    "DeadLetterRecord",
    "Handled",
    "OriginalUnavailable",
    "Target",
    "dead_letter_at",
    "dead_letter_info",
    "dead_letter_record",
    "partitions_holding",
    "read_at",
    "read_dead_letters",
    "read_original",
    "topic_partitions",
]


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
        return original_headers(self.headers)

    @property
    def replaced(self) -> str | None:
        """The reason label when this is a reference record (the value was replaced)."""
        for name, value in reversed(self.headers):
            if name == DLT_VALUE_REPLACED_HEADER:
                return value.decode(errors="replace") if isinstance(value, bytes) else value or ""
        return None


S = TypeVar("S", bound=StrEnum)


class Target(NamedTuple):
    """Where a replay sent (or, in a dry run, would send) a dead letter's copy."""

    topic: str
    partition: int | None = None
    """None until the broker acknowledged the copy."""
    offset: int | None = None


# No slots: a generic frozen dataclass with slots cannot be built through its alias
# (`Handled[ReplayState](...)`) on Python 3.11.
@dataclass(frozen=True)
class Handled(Generic[S]):
    """What `dlq replay` or `dlq resolve` did with one dead letter (`state`), and why."""

    record: DeadLetterRecord
    state: S
    detail: str = ""
    target: Target | None = None
    """Where its copy went (`dlq replay`)."""


def dead_letter_record(message: Message) -> DeadLetterRecord:
    """A record read from the DLQ, its DLQ headers read (or why they cannot be)."""
    headers, unreadable = read_headers(message)
    info: DeadLetterInfo | None = None
    problem: str | None = None
    if unreadable is not None:
        # Not one of them can be had (a name not UTF-8): the DLQ's own are lost with them.
        problem = f"headers unreadable: {unreadable}"
    else:
        try:
            info = DeadLetterInfo.from_headers(headers)
        except ContractViolation as exc:
            problem = str(exc)
    return DeadLetterRecord(
        partition_of(message),
        offset_of(message),
        message.key(),
        message.value(),
        headers,
        info,
        problem,
    )


def _next_record(consumer: Consumer, timeout: float, source: str) -> Message:
    """The next record of the consumer's assignment, error events skipped; TimeoutError when
    none comes within `timeout` (the assignment ends before the watermark it was read to)."""
    while True:
        message = consumer.poll(timeout)
        if message is None:
            raise TimeoutError(f"no record from {source} within {timeout}s")
        if message.error() is None:
            return message


def read_at(
    consumer: Consumer, topic: str, partition: int, offset: int, *, timeout: float
) -> Message | None:
    """The record at `offset` of `topic[partition]`, or None when the topic no longer has it
    (deleted by retention, compacted away) or never had it."""
    tp = TopicPartition(topic, partition)
    low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
    if not low <= offset < high:
        return None
    consumer.assign([TopicPartition(topic, partition, offset)])
    try:
        message = _next_record(consumer, timeout, f"{topic}[{partition}]")
        return message if offset_of(message) == offset else None
    finally:
        consumer.unassign()


def dead_letter_at(
    consumer: Consumer, topic: str, partition: int, offset: int, *, timeout: float
) -> DeadLetterRecord | None:
    message = read_at(consumer, topic, partition, offset, timeout=timeout)
    return dead_letter_record(message) if message is not None else None


class OriginalUnavailable(NamedTuple):
    """Why the original of a reference record cannot be had (``gone``: retention took it)."""

    gone: bool
    detail: str


def read_original(
    source: Consumer, record: DeadLetterRecord, *, timeout: float
) -> Message | OriginalUnavailable:
    """The original record a reference record stands for, read back from the source topic
    and checked against the reference's sha256."""
    reference = decode_reference(record.value)
    if isinstance(reference, Unreadable):
        return OriginalUnavailable(gone=False, detail=f"unreadable reference: {reference.reason}")
    place = (
        f"{reference.original_topic}[{reference.original_partition}]@{reference.original_offset}"
    )
    original = read_at(
        source,
        reference.original_topic,
        reference.original_partition,
        reference.original_offset,
        timeout=timeout,
    )
    if original is None:
        return OriginalUnavailable(
            gone=True, detail=f"the original {place} is no longer retained by the source topic"
        )
    if sha256_hex(original.value()) != reference.sha256:
        return OriginalUnavailable(
            gone=False, detail=f"the record at {place} is not the original (sha256)"
        )
    return original


def partitions_holding(consumer: Consumer, topic: str, offset: int, *, timeout: float) -> list[int]:
    """The partitions of `topic` whose retained records include `offset`."""
    found = []
    for partition in topic_partitions(consumer, topic, timeout):
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout
        )
        if low <= offset < high:
            found.append(partition)
    return found


def topic_partitions(consumer: Consumer, topic: str, timeout: float) -> list[int]:
    """The partition numbers of `topic` as the brokers have them now (an operator may have
    added some since the catalogue's count); `TopicMissingError` when it is not there."""
    metadata = consumer.list_topics(topic, timeout=timeout)
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        raise TopicMissingError(topic)
    return sorted(described.partitions)


def read_dead_letters(
    consumer: Consumer, topic: str, *, timeout: float
) -> Iterator[DeadLetterRecord]:
    """Every record of `topic` from the beginning to the current end, one at a time.

    A generator: the caller streams (a large DLQ is never held in memory whole). Assigns
    partitions directly (no group membership, nothing committed).
    """
    ends: dict[int, int] = {}
    for partition in topic_partitions(consumer, topic, timeout):
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
            message = _next_record(consumer, timeout, topic)
            partition, offset = partition_of(message), offset_of(message)
            if partition not in ends:
                continue
            if offset + 1 >= ends[partition]:
                del ends[partition]
            yield dead_letter_record(message)
    finally:
        consumer.unassign()
