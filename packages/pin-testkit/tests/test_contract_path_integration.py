"""A contract message through the real broker: encoded, keyed and traced as the producers
will do it, consumed and decoded as the consumers will."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from pin_contracts.codec import decode_membership_changed, encode
from pin_contracts.enums import AgentMembershipStatus, LeaveReason
from pin_contracts.envelope import envelope_for
from pin_contracts.kafka import headers_for, kafka_key
from pin_runtime.delivery import flush_or_raise
from pin_runtime.kafka import create_producer, record_headers
from pin_runtime.tracing import extract_context, inject_headers
from pin_testkit.events import membership_event
from pin_testkit.records import consume

pytestmark = pytest.mark.integration


def test_membership_event_survives_the_broker(
    kafka_bootstrap: str, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic(partitions=3)
    payload = membership_event(
        uuid.uuid4(),
        uuid.uuid4(),
        3,
        AgentMembershipStatus.LEFT,
        reason=LeaveReason.SELF_LEAVE,
        effective_at=datetime(2026, 12, 1, tzinfo=UTC),
        left_at=datetime(2026, 11, 30, 9, 0, tzinfo=UTC),
        joined_at=datetime(2026, 1, 10, tzinfo=UTC),
        membership_id=uuid.uuid4(),
    )
    envelope = envelope_for(payload, correlation_id="run-1")
    tracer = TracerProvider().get_tracer("test")
    headers = headers_for(envelope)
    with tracer.start_as_current_span("publish") as span:
        inject_headers(headers)
        sent_trace_id = span.get_span_context().trace_id

    producer = create_producer(kafka_bootstrap, client_id="contract-path")
    producer.produce(topic, key=kafka_key(envelope), value=encode(envelope), headers=headers)
    flush_or_raise(producer, 30)

    [message] = consume(kafka_bootstrap, topic, 1, group_prefix="contract-path")

    assert message.key() == str(payload.agent_user_id).encode()
    decoded = decode_membership_changed(message.value())
    assert decoded == envelope
    carried = trace.get_current_span(extract_context(record_headers(message))).get_span_context()
    assert carried.trace_id == sent_trace_id
