"""Spans: receive (batch) -> pg apply batch, and a process span continuing the producer's trace."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from pin_contracts import AgentMembershipChanged, encode, envelope_for, headers_for, kafka_key

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def test_spans_follow_the_message_trace(
    kafka: Any, start_consumer: Any, event: Callable[..., AgentMembershipChanged]
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    consumer = start_consumer(tracer=provider.get_tracer("test"))
    envelope = envelope_for(event(uuid.uuid4(), uuid.uuid4(), 1))
    headers = headers_for(envelope, trace_context={"traceparent": f"00-{TRACE_ID}-{PARENT}-01"})
    kafka.send_raw((kafka_key(envelope), encode(envelope), headers))
    consumer.wait_handled(1)
    consumer.close()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    receive = spans[f"{kafka.topic} receive"]
    storage = spans["pg apply batch"]
    process = spans[f"{kafka.topic} process"]
    assert receive.kind is SpanKind.CONSUMER
    assert receive.attributes is not None
    assert receive.attributes["messaging.system"] == "kafka"
    assert receive.attributes["messaging.batch.message_count"] == 1
    batch = spans["membership batch process"]
    assert batch.parent is not None
    assert batch.parent.span_id == receive.context.span_id
    assert storage.parent is not None
    assert storage.parent.span_id == batch.context.span_id
    assert process.parent is not None
    assert format(process.context.trace_id, "032x") == TRACE_ID
    assert format(process.parent.span_id, "016x") == PARENT
    assert process.attributes is not None
    assert process.attributes["messaging.message.id"] == str(envelope.message_id)
    assert process.attributes["rewards.membership.outcome"] == "membership-applied"
    assert [link.context.trace_id for link in receive.links] == [process.context.trace_id]
    provider.shutdown()
