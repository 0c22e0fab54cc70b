"""A consumed record as the consumer carries it from its poll to its report (`Record`: the
message, what validation made of it, its outcome, where its dead letter went), typed
accessors of a confluent-kafka `Message` (its getters are all optional), and the fields
every log line of its event carries (`event_fields`: the consumer's lines and the
dead-letter writer's alike). Read by `consumer` and `dlq` both, so it belongs to neither:
`dlq` reads records without importing the consumer that writes through it.

Headers are read through pin-runtime's `read_headers` only: a record whose header names
are not UTF-8 has none here instead of raising (docs/design/rewards-membership.md "Bytes
nobody vouches for")."""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec
from confluent_kafka import Message
from opentelemetry import trace

from pin_contracts import TRACEPARENT_HEADER, Headers
from pin_runtime.kafka import record_headers
from rewards_membership.rules.plan import Outcome
from rewards_membership.rules.validation import (
    LOGGED_FIELDS,
    InvalidEvent,
    Item,
    MembershipChange,
    position_key,
    validate,
)

__all__ = [
    "Position",
    "Receipt",
    "Record",
    "event_fields",
    "headers_of",
    "key_text",
    "offset_of",
    "partition_of",
    "topic_of",
]

Position = tuple[int, int]
"""(partition, offset) of a record."""


class Receipt(msgspec.Struct, frozen=True):
    """Where the broker stored a record's dead letter."""

    dlq_partition: int
    dlq_offset: int
    replaced: str | None = None
    """The refusal's reason label when a reference record stands for the original."""


class Record(msgspec.Struct, gc=False):
    """One consumed record, from its poll to its report: the message, what validation made
    of it (`Record.of`), and, once its batch's transaction committed, its outcome and
    where its dead letter is. A Struct: a batch makes thousands, on the poll thread; never
    tracked by the collector (nothing it holds refers back to it), which would otherwise
    walk two or three batches of them again and again."""

    message: Message
    item: Item
    outcome: Outcome | None = None
    """The batch statement's decision; reported as what it was when an earlier try of the
    batch committed it (a dead letter written, a duplicate of what that try applied)."""
    receipt: Receipt | None = None
    """Where its dead letter is in the DLQ, when this process wrote it."""

    @classmethod
    def of(cls, message: Message) -> Record:
        """The record validated, its Kafka key checked; an invalid one without a readable
        MessageId is keyed by its position (dead-lettered once however often it comes)."""
        item = validate(message.value(), message.key())
        if type(item) is InvalidEvent and item.key is None:
            key = position_key(topic_of(message), partition_of(message), offset_of(message))
            item = msgspec.structs.replace(item, key=key)
        return cls(message, item)

    @property
    def partition(self) -> int:
        return partition_of(self.message)

    @property
    def position(self) -> Position:
        return (partition_of(self.message), offset_of(self.message))


def partition_of(message: Message) -> int:
    partition = message.partition()
    if partition is None:
        raise ValueError("consumed message without a partition")
    return partition


def offset_of(message: Message) -> int:
    offset = message.offset()
    if offset is None:
        raise ValueError("consumed message without an offset")
    return offset


def topic_of(message: Message) -> str:
    return message.topic() or ""


def headers_of(message: Message) -> Headers:
    """The record's headers (a new list); none when the client cannot read them."""
    return record_headers(message)


def key_text(message: Message) -> str | None:
    key: object = message.key()
    if key is None:
        return None
    if isinstance(key, str):
        return key
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key).decode("utf-8", errors="replace")
    return str(key)


def event_fields(item: Item, message: Message, batch: trace.SpanContext | None) -> dict[str, Any]:
    """Every field the spec names for a log line of this event, and its correlation: its
    CorrelationId and `trace_id` (its producer's, from its traceparent; else `batch`'s)."""
    fields: dict[str, Any]
    if isinstance(item, MembershipChange):
        payload = item.payload
        fields = {
            "MessageId": item.message_id,
            "AgentUserId": payload.agent_user_id,
            "CompanyId": payload.company_id,
            "Status": payload.status,
            "Reason": payload.reason,
            "Version": payload.version,
            "MembershipId": payload.membership_id,
            "CorrelationId": item.correlation_id,
        }
    else:
        fields = {
            "MessageId": item.message_id,
            **dict.fromkeys(LOGGED_FIELDS),
            "CorrelationId": None,
            **item.fields,
        }
    fields["trace_id"] = _trace_id(message) or (
        format(batch.trace_id, "032x") if batch is not None and batch.is_valid else None
    )
    return fields


def _trace_id(message: Message) -> str | None:
    """The trace id of the record's traceparent (`00-<trace id>-<span id>-<flags>`)."""
    for name, value in record_headers(message):
        if name == TRACEPARENT_HEADER and isinstance(value, bytes):
            # Any bytes may stand here: only 32 lowercase hex digits, not all zero, are a
            # trace id (W3C); anything else is no trace id, not an error.
            found = _TRACE_ID.match(value)
            trace_id = found and found.group(1)
            return trace_id.decode() if trace_id and trace_id != _NO_TRACE else None
    return None


_TRACE_ID: Final = re.compile(rb"[0-9a-f]{2}-([0-9a-f]{32})-")
"""The trace id of a W3C traceparent (`<version>-<trace id>-<span id>-<flags>`)."""
_NO_TRACE: Final = b"0" * 32
