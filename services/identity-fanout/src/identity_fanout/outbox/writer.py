"""The events a writer puts into the transactional outbox, as the records the relay will
publish (`OutboxMessage`); `OutboxStore.write` puts them in.

A row commits with the change that caused it, or not at all; the relay publishes it after
commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar
from uuid import UUID

import msgspec
from opentelemetry import propagate

from pin_contracts import Envelope, EventPayload, encode, headers_for, kafka_key
from pin_contracts.topics import Topic

P = TypeVar("P", bound=EventPayload)


class OutboxMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One Kafka record as the relay will publish it, byte for byte."""

    topic: str
    key: str
    value: bytes
    headers: tuple[tuple[str, str], ...]
    message_id: UUID
    event_type: str


def current_trace_context() -> dict[str, str]:
    """The W3C headers of the span active now: what the records written under it carry."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def outbox_message(
    envelope: Envelope[P], topic: Topic, *, trace_context: Mapping[str, str] | None = None
) -> OutboxMessage:
    """The record for ``envelope`` with ``trace_context`` (default: the active span's).

    A batch passes the context it took once: every record of a batch has the same parent.
    """
    carrier = current_trace_context() if trace_context is None else trace_context
    headers = headers_for(envelope, trace_context=carrier)
    return OutboxMessage(
        topic=topic.name,
        key=kafka_key(envelope).decode(),
        value=encode(envelope),
        headers=tuple(
            (name, value.decode() if isinstance(value, bytes) else value or "")
            for name, value in headers
        ),
        message_id=envelope.message_id,
        event_type=envelope.event_type,
    )
