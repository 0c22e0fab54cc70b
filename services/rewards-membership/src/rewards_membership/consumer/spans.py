"""The consumer's spans: a batch's receive and process spans, and a span per traced record.

A batch's work spans two turns of the loop and two threads, so its spans are started, not
made current: the process span and the `pg apply batch` span below it carry it explicitly.
A record's own span continues its producer's trace and is written only for a record that
carries one, after its batch committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Message
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from pin_contracts import TRACEPARENT_HEADER
from pin_runtime.tracing import extract_context
from rewards_membership.consumer.records import key_text, offset_of, partition_of
from rewards_membership.rules.plan import Outcome
from rewards_membership.rules.validation import Item

__all__ = ["BatchSpans"]

_MAX_LINKS: Final = 32
"""Links from a batch's receive span to its records' traces, at most."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSpans:
    tracer: trace.Tracer
    topic: str
    group_id: str

    def start(self, records: Sequence[Message]) -> tuple[trace.Span, trace.Span]:
        """The batch's `<topic> receive` span, linked to the records' own trace contexts,
        and its `membership batch process` child."""
        links = []
        for message in records[:_MAX_LINKS]:
            context = trace.get_current_span(extract_context(message.headers())).get_span_context()
            if context.is_valid:
                links.append(Link(context))
        receive = self.tracer.start_span(
            f"{self.topic} receive",
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "receive",
                "messaging.operation.name": "consume",
                "messaging.destination.name": self.topic,
                "messaging.consumer.group.name": self.group_id,
                "messaging.batch.message_count": len(records),
            },
        )
        process = self.tracer.start_span(
            "membership batch process",
            context=trace.set_span_in_context(receive),
            attributes={
                "messaging.operation.type": "process",
                "messaging.destination.name": self.topic,
                "messaging.batch.message_count": len(records),
            },
        )
        return receive, process

    def record(
        self, message: Message, item: Item, outcome: Outcome, batch: trace.SpanContext
    ) -> None:
        """A per-message span continuing the producer's trace (only for traced messages)."""
        if not _has_traceparent(message):
            return
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.destination.name": self.topic,
            "messaging.consumer.group.name": self.group_id,
            "messaging.destination.partition.id": str(partition_of(message)),
            "messaging.kafka.offset": offset_of(message),
            "rewards.membership.outcome": outcome.value,
        }
        key = key_text(message)
        if key is not None:
            attributes["messaging.kafka.message.key"] = key
        if item.message_id is not None:
            attributes["messaging.message.id"] = str(item.message_id)
        span = self.tracer.start_span(
            f"{self.topic} process",
            context=extract_context(message.headers()),
            kind=SpanKind.CONSUMER,
            links=[Link(batch)],
            attributes=attributes,
        )
        if outcome is Outcome.DEAD_LETTERED:
            span.set_status(Status(StatusCode.ERROR, "REWARDS_MEMBERSHIP_EVENT_INVALID"))
        span.end()


def _has_traceparent(message: Message) -> bool:
    headers = message.headers()
    if not headers:
        return False
    if isinstance(headers, dict):
        return TRACEPARENT_HEADER in headers
    # A plain loop, not any(<generator>): this runs once per record.
    for name, _ in headers:  # noqa: SIM110
        if name == TRACEPARENT_HEADER:
            return True
    return False
