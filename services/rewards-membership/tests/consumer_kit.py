"""What a consumer test on its own topics uses, as one value: the ``kit`` fixture; and
``publish``, membership events written to a topic as identity's relay writes them.

Imported by the test modules (``conftest`` puts this directory on ``sys.path``).
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

__all__ = ["ConsumerKit", "publish"]


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


def publish(
    producer: Producer, topic: str, *payloads: AgentMembershipChanged
) -> list[Envelope[AgentMembershipChanged]]:
    """Each payload in an envelope of its own, with the key and headers the relay gives it,
    every record acknowledged (or DeliveryError); the envelopes, in order."""
    envelopes = [envelope_for(p) for p in payloads]
    tracker = DeliveryTracker[int]()
    for envelope in envelopes:
        producer.produce(
            topic,
            key=kafka_key(envelope),
            value=encode(envelope),
            headers=headers_for(envelope),
            on_delivery=tracker,
        )
    flush_or_raise(producer, 30.0, tracker)
    return envelopes
