"""What a consumer test on its own topics uses, as one value: the ``kit`` fixture; and
``publish`` (``publish_raw``, ``record_of``), records written to a topic as identity's relay
writes them.

Imported by the test modules (the root pyproject's pytest ``pythonpath`` lists this directory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from pin_contracts import (
    AgentMembershipChanged,
    Envelope,
    encode,
    envelope_for,
    headers_for,
    kafka_key,
)
from pin_runtime.delivery import DeliveryTracker, flush_or_raise
from rewards_membership.settings import Settings

__all__ = ["ConsumerKit", "RawRecord", "publish", "publish_raw", "record_of"]


@dataclass(frozen=True)
class ConsumerKit:
    """The broker, new topics, the consumer in a thread (``start_consumer``), payloads, raw
    values, SQL on the test's database, the consumer's settings and waiting."""

    kafka_bootstrap: str
    kafka_topic: Callable[..., str]
    start_consumer: Callable[..., Any]
    event: Callable[..., AgentMembershipChanged]
    raw: Callable[..., bytes]
    sql: Callable[..., list[tuple[Any, ...]]]
    settings: Settings
    wait: Callable[..., float]


RawRecord = tuple[bytes | None, bytes | None, list[Any] | None]
"""Key, value and headers of a record as written, whatever the value holds."""


def record_of(envelope: Envelope[AgentMembershipChanged]) -> RawRecord:
    """The record identity's relay writes for ``envelope``: its key, value and headers."""
    return kafka_key(envelope), encode(envelope), headers_for(envelope)


def publish_raw(producer: Producer, topic: str, *records: RawRecord) -> None:
    """The records, in order, every one acknowledged (or DeliveryError)."""
    tracker = DeliveryTracker[int]()
    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers or [], on_delivery=tracker)
    flush_or_raise(producer, 30.0, tracker)


def publish(
    producer: Producer, topic: str, *payloads: AgentMembershipChanged
) -> list[Envelope[AgentMembershipChanged]]:
    """Each payload in an envelope of its own, written as the relay writes it, every record
    acknowledged (or DeliveryError); the envelopes, in order."""
    envelopes = [envelope_for(p) for p in payloads]
    publish_raw(producer, topic, *map(record_of, envelopes))
    return envelopes
