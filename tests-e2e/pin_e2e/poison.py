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
    Headers,
    encode,
    envelope_for,
    headers_for,
    kafka_key,
)

__all__ = ["NOT_JSON", "SOURCE_SLACK", "Raw", "empty_agent_event", "oversized_dead_letter_event"]

Raw = tuple[bytes | None, bytes | None, Headers]
SOURCE_SLACK: Final = 200
"""Bytes of a record's framing left free under the topic limit (far fewer than the DLQ adds)."""
NOT_JSON: Final[Raw] = (b"not-json", b"\x00\xffthis is not JSON", [])


def empty_agent_event(agency: uuid.UUID) -> Raw:
    """A well-formed event whose AgentUserId is Guid.Empty: the consumer must refuse it."""
    envelope = envelope_for(
        AgentMembershipChanged(
            membership_id=uuid.uuid4(),
            agent_user_id=EMPTY_GUID,
            company_id=agency,
            status=AgentMembershipStatus.ACTIVE,
            version=1,
            joined_at=datetime.now(UTC),
        )
    )
    return kafka_key(envelope), encode(envelope), headers_for(envelope)


def oversized_dead_letter_event(topic_limit: int) -> Raw:
    """Empty CompanyId plus an unknown field: a record just under ``topic_limit`` bytes.

    Key, value and headers fill the limit but for ``SOURCE_SLACK`` bytes (the record's own
    framing), so the broker takes the record, and its dead-letter copy, which carries a few
    hundred bytes of ``kafka_dlt-*`` headers more, is over the DLQ topic's equal limit.
    """
    envelope = envelope_for(
        AgentMembershipChanged(
            membership_id=uuid.uuid4(),
            agent_user_id=uuid.uuid4(),
            company_id=EMPTY_GUID,
            status=AgentMembershipStatus.ACTIVE,
            version=1,
            joined_at=datetime.now(UTC),
        )
    )
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
