"""Spans by the messaging conventions: per batch `poll <topic>` -> `process <topic>` -> the
statement's span; per traced event, in its producer's trace, the receive -> process ->
storage chain (spec "Наблюдаемость") with its batch's real times."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from pin_contracts import AgentMembershipChanged, encode, envelope_for, headers_for, kafka_key
from rewards_membership.consumer.spans import STORAGE_SPAN

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def one(among: list[ReadableSpan], name: str) -> ReadableSpan:
    [found] = [s for s in among if s.name == name]
    return found


def times(span: ReadableSpan) -> tuple[int, int]:
    assert span.start_time is not None
    assert span.end_time is not None
    return span.start_time, span.end_time


def test_spans_follow_the_message_trace(
    kafka: Any, start_consumer: Any, event: Callable[..., AgentMembershipChanged]
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    consumer = start_consumer(tracer=provider.get_tracer("test"))
    envelope = envelope_for(event(uuid.uuid4(), uuid.uuid4(), 1), correlation_id="role-change-7")
    headers = headers_for(envelope, trace_context={"traceparent": f"00-{TRACE_ID}-{PARENT}-01"})
    kafka.send_raw((kafka_key(envelope), encode(envelope), headers))
    consumer.wait_handled(1)
    consumer.close()
    spans = exporter.get_finished_spans()
    produced = [s for s in spans if format(s.context.trace_id, "032x") == TRACE_ID]
    batch = [s for s in spans if format(s.context.trace_id, "032x") != TRACE_ID]

    # The batch: poll (CLIENT, linked to the event's trace) -> process -> the statement.
    poll = one(batch, f"poll {kafka.topic}")
    process = one(batch, f"process {kafka.topic}")
    statement = one(batch, STORAGE_SPAN)
    assert poll.kind is SpanKind.CLIENT
    assert poll.attributes is not None
    assert poll.attributes["messaging.system"] == "kafka"
    assert poll.attributes["messaging.operation.type"] == "receive"
    assert poll.attributes["messaging.operation.name"] == "poll"
    assert poll.attributes["messaging.batch.message_count"] == 1
    assert [format(link.context.trace_id, "032x") for link in poll.links] == [TRACE_ID]
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is not None
    assert process.parent.span_id == poll.context.span_id
    assert statement.parent is not None
    assert statement.parent.span_id == process.context.span_id
    assert statement.attributes is not None
    assert statement.attributes["db.system.name"] == "postgresql"

    # The event, in its producer's trace: receive -> process -> storage, in time order.
    receive = one(produced, f"poll {kafka.topic}")
    handled = one(produced, f"process {kafka.topic}")
    storage = one(produced, STORAGE_SPAN)
    assert receive.parent is not None
    assert format(receive.parent.span_id, "016x") == PARENT
    assert handled.parent is not None
    assert handled.parent.span_id == receive.context.span_id
    assert storage.parent is not None
    assert storage.parent.span_id == handled.context.span_id
    assert handled.attributes is not None
    assert handled.attributes["messaging.message.id"] == str(envelope.message_id)
    assert handled.attributes["messaging.message.conversation_id"] == "role-change-7"
    assert handled.attributes["messaging.operation.type"] == "process"
    assert handled.attributes["rewards.membership.outcome"] == "membership-applied"
    assert [link.context.span_id for link in handled.links] == [process.context.span_id]
    (received, polled), (started, ended) = times(receive), times(handled)
    stored_from, stored_to = times(storage)
    assert received <= polled <= started <= stored_from <= stored_to <= ended
    provider.shutdown()
