"""Headers of a dead-lettered record (``pin.rewards.identity-membership-dlq.v1``).

Names and byte encodings follow Spring Kafka's DeadLetterPublishingRecoverer, so tooling
that understands Spring's DLT headers reads ours: partition is a 4-byte big-endian int,
offset and timestamp 8-byte big-endian longs, everything else UTF-8 text.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from pin_contracts.errors import ContractViolation, InvalidEventError
from pin_contracts.kafka import Headers, ReceivedHeaders

__all__ = [
    "DLQ_HEADERS",
    "DLT_EXCEPTION_FQCN_HEADER",
    "DLT_EXCEPTION_MESSAGE_HEADER",
    "DLT_ORIGINAL_CONSUMER_GROUP_HEADER",
    "DLT_ORIGINAL_OFFSET_HEADER",
    "DLT_ORIGINAL_PARTITION_HEADER",
    "DLT_ORIGINAL_TIMESTAMP_HEADER",
    "DLT_ORIGINAL_TIMESTAMP_TYPE_HEADER",
    "DLT_ORIGINAL_TOPIC_HEADER",
    "DLT_VALUE_REPLACED_HEADER",
    "ERROR_CODE_HEADER",
    "ERROR_PATH_HEADER",
    "REWARDS_MEMBERSHIP_EVENT_INVALID",
    "DeadLetterInfo",
    "original_headers",
]

DLT_EXCEPTION_MESSAGE_HEADER = "kafka_dlt-exception-message"
DLT_EXCEPTION_FQCN_HEADER = "kafka_dlt-exception-fqcn"
DLT_ORIGINAL_TOPIC_HEADER = "kafka_dlt-original-topic"
DLT_ORIGINAL_PARTITION_HEADER = "kafka_dlt-original-partition"
DLT_ORIGINAL_OFFSET_HEADER = "kafka_dlt-original-offset"
DLT_ORIGINAL_TIMESTAMP_HEADER = "kafka_dlt-original-timestamp"
DLT_ORIGINAL_TIMESTAMP_TYPE_HEADER = "kafka_dlt-original-timestamp-type"
DLT_ORIGINAL_CONSUMER_GROUP_HEADER = "kafka_dlt-original-consumer-group"
ERROR_CODE_HEADER = "pin-error-code"
ERROR_PATH_HEADER = "pin-error-path"
DLT_VALUE_REPLACED_HEADER = "pin-dlt-value-replaced"
"""Present on a dead letter whose original value the DLQ refused (too large): the value is
then a small JSON reference (original topic, partition, offset, size, sha256, error) and the
header's text is the refusal's reason label (e.g. ``too-large``). The original bytes stay in
the source topic while it retains them."""

DLQ_HEADERS: Final[frozenset[str]] = frozenset(
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
        DLT_VALUE_REPLACED_HEADER,
    }
)
"""Every header a dead letter carries on top of its original record's headers: what a
replay strips to give the record back its own headers (`original_headers`)."""

REWARDS_MEMBERSHIP_EVENT_INVALID = "REWARDS_MEMBERSHIP_EVENT_INVALID"
"""``pin-error-code`` of a membership event that violates its contract."""

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterInfo:
    """Why and from where a record was dead-lettered; the record keeps its key and value."""

    error_code: str
    exception_message: str
    exception_fqcn: str
    original_topic: str
    original_partition: int
    original_offset: int
    original_timestamp_ms: int
    original_consumer_group: str
    original_timestamp_type: str = "CreateTime"
    error_path: str | None = None

    def __post_init__(self) -> None:
        if not -(2**31) <= self.original_partition < 2**31:
            raise InvalidEventError(DLT_ORIGINAL_PARTITION_HEADER, "must fit a 32-bit int")
        for name, number in (
            (DLT_ORIGINAL_OFFSET_HEADER, self.original_offset),
            (DLT_ORIGINAL_TIMESTAMP_HEADER, self.original_timestamp_ms),
        ):
            if not -(2**63) <= number < 2**63:
                raise InvalidEventError(name, "must fit a 64-bit long")

    def to_headers(self) -> Headers:
        """DLQ headers to append after the original record's headers."""
        headers: Headers = [
            (ERROR_CODE_HEADER, self.error_code.encode()),
            (DLT_EXCEPTION_MESSAGE_HEADER, self.exception_message.encode()),
            (DLT_EXCEPTION_FQCN_HEADER, self.exception_fqcn.encode()),
            (DLT_ORIGINAL_TOPIC_HEADER, self.original_topic.encode()),
            (DLT_ORIGINAL_PARTITION_HEADER, _INT.pack(self.original_partition)),
            (DLT_ORIGINAL_OFFSET_HEADER, _LONG.pack(self.original_offset)),
            (DLT_ORIGINAL_TIMESTAMP_HEADER, _LONG.pack(self.original_timestamp_ms)),
            (DLT_ORIGINAL_TIMESTAMP_TYPE_HEADER, self.original_timestamp_type.encode()),
            (DLT_ORIGINAL_CONSUMER_GROUP_HEADER, self.original_consumer_group.encode()),
        ]
        if self.error_path is not None:
            headers.append((ERROR_PATH_HEADER, self.error_path.encode()))
        return headers

    @classmethod
    def from_headers(cls, headers: ReceivedHeaders) -> DeadLetterInfo:
        """Read the DLQ headers of a dead-lettered record (the last of each name wins)."""
        # Last wins: a record dead-lettered again after a replay carries both sets.
        latest: dict[str, bytes | None] = {
            name: value.encode() if isinstance(value, str) else value
            for name, value in headers or ()
        }

        def raw(name: str) -> bytes:
            value = latest.get(name)
            if value is None:
                raise ContractViolation(f"headers.{name}", "missing")
            return value

        def text(name: str) -> str:
            try:
                return raw(name).decode()
            except UnicodeDecodeError as exc:
                raise ContractViolation(f"headers.{name}", "not UTF-8") from exc

        def number(name: str, codec: struct.Struct) -> int:
            value = raw(name)
            if len(value) != codec.size:
                raise ContractViolation(
                    f"headers.{name}", f"expected {codec.size} bytes, got {len(value)}"
                )
            result: int = codec.unpack(value)[0]
            return result

        error_path = text(ERROR_PATH_HEADER) if latest.get(ERROR_PATH_HEADER) else None
        return cls(
            error_code=text(ERROR_CODE_HEADER),
            exception_message=text(DLT_EXCEPTION_MESSAGE_HEADER),
            exception_fqcn=text(DLT_EXCEPTION_FQCN_HEADER),
            original_topic=text(DLT_ORIGINAL_TOPIC_HEADER),
            original_partition=number(DLT_ORIGINAL_PARTITION_HEADER, _INT),
            original_offset=number(DLT_ORIGINAL_OFFSET_HEADER, _LONG),
            original_timestamp_ms=number(DLT_ORIGINAL_TIMESTAMP_HEADER, _LONG),
            original_timestamp_type=text(DLT_ORIGINAL_TIMESTAMP_TYPE_HEADER),
            original_consumer_group=text(DLT_ORIGINAL_CONSUMER_GROUP_HEADER),
            error_path=error_path,
        )


def original_headers(headers: Headers) -> Headers:
    """The headers a record had before it was dead-lettered: the DLQ's own removed, the
    rest (trace context, MessageId, ...) kept in order."""
    return [(name, value) for name, value in headers if name not in DLQ_HEADERS]
