"""Records that must not stop a flow: what scenarios 7 and 8 and the chaos campaign send."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Final

from pin_contracts import (
    EMPTY_GUID,
    AgentMembershipChanged,
    AgentMembershipStatus,
    Envelope,
    Headers,
    encode,
    envelope_for,
    headers_for,
    kafka_key,
)
from pin_testkit import events

__all__ = [
    "NOT_JSON",
    "SOURCE_SLACK",
    "Raw",
    "empty_agent_event",
    "membership_event",
    "oversized_dead_letter_event",
    "raw_record",
]

Raw = tuple[bytes | None, bytes | None, Headers]
SOURCE_SLACK: Final = 200
"""Bytes of a record's framing left free under the topic limit (far fewer than the DLQ adds)."""
NOT_JSON: Final[Raw] = (b"not-json", b"\x00\xffthis is not JSON", [])


def membership_event(
    agent: uuid.UUID,
    agency: uuid.UUID,
    status: AgentMembershipStatus = AgentMembershipStatus.ACTIVE,
    *,
    joined_at: datetime | None = None,
    left_at: datetime | None = None,
) -> Envelope[AgentMembershipChanged]:
    """The first event (version 1) of a new membership, joined now unless ``joined_at``."""
    return envelope_for(
        events.membership_event(
            agent,
            agency,
            1,
            status,
            left_at=left_at,
            joined_at=joined_at or datetime.now(UTC),
            membership_id=uuid.uuid4(),
        )
    )


def raw_record(envelope: Envelope[AgentMembershipChanged], value: bytes | None = None) -> Raw:
    """The record a producer writes for ``envelope``: its key, value (or ``value`` instead,
    a document edited past the encoder) and headers."""
    return kafka_key(envelope), value or encode(envelope), headers_for(envelope)


def empty_agent_event(agency: uuid.UUID) -> Raw:
    """A well-formed event whose AgentUserId is Guid.Empty: the consumer must refuse it."""
    return raw_record(membership_event(EMPTY_GUID, agency))


def oversized_dead_letter_event(topic_limit: int) -> Raw:
    """Empty CompanyId plus an unknown field: a record just under ``topic_limit`` bytes.

    Key, value and headers fill the limit but for ``SOURCE_SLACK`` bytes (the record's own
    framing), so the broker takes the record, and its dead-letter copy, which carries a few
    hundred bytes of ``kafka_dlt-*`` headers more, is over the DLQ topic's equal limit.
    """
    envelope = membership_event(uuid.uuid4(), EMPTY_GUID)
    key = kafka_key(envelope)
    headers: Headers = list(headers_for(envelope))
    header_bytes = sum(len(name) + len(value or b"") for name, value in headers)
    document = json.loads(encode(envelope))
    document["Payload"]["Blob"] = ""
    bare = len(json.dumps(document).encode())
    document["Payload"]["Blob"] = "x" * (
        topic_limit - SOURCE_SLACK - len(key) - header_bytes - bare
    )
    return key, json.dumps(document).encode(), headers
