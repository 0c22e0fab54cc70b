"""The reference record: what goes to the DLQ when the dead letter itself cannot.

A record the DLQ refuses for good (larger than the DLQ topic's `max.message.bytes`, or the
client's `message.max.bytes`) would otherwise stop its partition forever. Instead the DLQ
gets a small JSON value naming where the original is (topic, partition, offset), how to
recognise it (size, sha256) and why it was replaced; `dlq replay` reads the original back
from the source topic while the topic retains it. Pure: building and parsing only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Annotated, Final

import msgspec

from pin_contracts import (
    DLT_VALUE_REPLACED_HEADER,
    DeadLetterInfo,
    Headers,
    Unreadable,
    read_untrusted,
)

__all__ = [
    "MAX_KEPT_HEADER_BYTES",
    "DeadLetterReference",
    "decode_reference",
    "reference_for",
    "reference_headers",
    "sha256_hex",
]

MAX_KEPT_HEADER_BYTES: Final = 16 * 1024
"""The original headers travel with the reference only up to this size (they may be what
made the record too large); a replay reads them from the source topic anyway."""


class DeadLetterReference(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The value of a reference record (JSON, camelCase names)."""

    original_topic: str
    original_partition: Annotated[int, msgspec.Meta(ge=0, lt=2**31)]
    original_offset: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    """Bounded as Kafka bounds them: a replay reads the source topic at this place."""
    original_timestamp_ms: int
    size: int
    """Bytes of the original value."""
    sha256: str
    """Hex SHA-256 of the original value: a replay checks the bytes it reads back."""
    error: str
    """Why the DLQ refused the original, e.g. `MSG_SIZE_TOO_LARGE: Broker: Message size too
    large`."""


_decoder = msgspec.json.Decoder(DeadLetterReference)


def sha256_hex(value: bytes | None) -> str:
    return hashlib.sha256(value or b"").hexdigest()


def reference_for(info: DeadLetterInfo, value: bytes | None, error: str) -> bytes:
    """The JSON value replacing a refused dead letter."""
    return msgspec.json.encode(
        DeadLetterReference(
            original_topic=info.original_topic,
            original_partition=info.original_partition,
            original_offset=info.original_offset,
            original_timestamp_ms=info.original_timestamp_ms,
            size=len(value or b""),
            sha256=sha256_hex(value),
            error=error,
        )
    )


def reference_headers(
    original: Sequence[tuple[str, str | bytes | None]], info: DeadLetterInfo, reason: str
) -> Headers:
    """Original headers (when small), the DLQ headers, then the replaced-value marker."""
    size = sum(len(name) + len(value or b"") for name, value in original)
    kept = list(original) if size <= MAX_KEPT_HEADER_BYTES else []
    return [*kept, *info.to_headers(), (DLT_VALUE_REPLACED_HEADER, reason.encode())]


def decode_reference(value: bytes | None) -> DeadLetterReference | Unreadable:
    """A reference record's value, or why it is not one (never raises: a DLQ holds
    whatever anyone wrote to it)."""
    return read_untrusted(_decoder, value or b"")
