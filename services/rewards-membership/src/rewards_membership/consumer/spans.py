"""The consumer's spans, named and attributed by the OpenTelemetry messaging conventions
(`{operation} {destination}`, `messaging.operation.type` / `.name`), as the relay's are.

Per batch: `poll <topic>` (CLIENT, the receive; linked to the records' own traces), its
child `process <topic>` (CONSUMER), and below that the batch statement's span (`BatchApplier`),
started, not made current, since a batch's work spans two turns of the loop and two threads.

Per event that carries a trace context (spec "Наблюдаемость": receive -> process -> storage,
correlated from the event's metadata): in the event's own trace, under its producer's span,
`poll <topic>` -> `process <topic>` -> `STORAGE_SPAN`, each with the real times of its
batch's steps (`BatchTimes`), written once the batch committed: a batch that fails is
retried, and its records' spans are those of the try that committed them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Message
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from pin_contracts import TRACEPARENT_HEADER, Headers
from pin_runtime.tracing import extract_context
from rewards_membership.consumer.decided import Decided
from rewards_membership.records import headers_of, key_text, offset_of, partition_of
from rewards_membership.rules.plan import Outcome
from rewards_membership.rules.validation import MembershipChange

__all__ = ["STORAGE_ATTRIBUTES", "STORAGE_SPAN", "BatchSpans", "BatchTimes"]

_MAX_LINKS: Final = 32
"""Links from a batch's receive span to its records' traces, at most."""

STORAGE_SPAN: Final = "apply_membership_batch rewards"
"""The batch statement's span (database conventions: `{db.query.summary}`)."""
STORAGE_ATTRIBUTES: Final[dict[str, str]] = {
    "db.system.name": "postgresql",
    "db.namespace": "rewards",
    "db.query.summary": STORAGE_SPAN,
    "db.collection.name": "rewards.agent_performance",
}


@dataclass(frozen=True, slots=True)
class BatchTimes:
    """When a batch's steps ran (`time.time_ns()`): the per-event spans carry these."""

    poll_started: int
    polled: int
    """consume() returned the batch (its receive)."""
    handed: int
    """Handed to the database thread (its processing began)."""
    stored: tuple[int, int] | None
    """The batch statement ran (None: nothing needed the database)."""
    committed: int
    """Its offsets were committed (its processing ended)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSpans:
    tracer: trace.Tracer
    topic: str
    group_id: str

    def start(self, records: Sequence[Message], *, poll_started: int, polled: int) -> trace.Span:
        """The batch's `poll <topic>` span, linked to the records' own trace contexts (ended
        as the poll returned), and its `process <topic>` child, returned: the caller ends it
        when the batch committed or failed."""
        links = []
        for message in records[:_MAX_LINKS]:
            context = trace.get_current_span(
                extract_context(headers_of(message))
            ).get_span_context()
            if context.is_valid:
                links.append(Link(context))
        receive = self.tracer.start_span(
            f"poll {self.topic}",
            kind=SpanKind.CLIENT,
            links=links,
            start_time=poll_started,
            attributes=self._attributes("receive", "poll")
            | {
                "messaging.batch.message_count": len(records),
            },
        )
        receive.end(end_time=polled)
        return self.tracer.start_span(
            f"process {self.topic}",
            context=trace.set_span_in_context(receive),
            kind=SpanKind.CONSUMER,
            attributes=self._attributes("process", "process")
            | {
                "messaging.batch.message_count": len(records),
            },
        )

    def record(
        self, decided: Decided, headers: Headers, batch: trace.SpanContext, times: BatchTimes
    ) -> None:
        """The event's receive -> process -> storage spans in its producer's trace (only for
        a record that carries one). `headers`: the record's, read once by the caller."""
        message, item, outcome = decided.message, decided.item, decided.outcome
        if not _has_traceparent(headers):
            return
        attributes = self._attributes("receive", "poll") | {
            "messaging.destination.partition.id": str(partition_of(message)),
            "messaging.kafka.offset": offset_of(message),
        }
        key = key_text(message)
        if key is not None:
            attributes["messaging.kafka.message.key"] = key
        if item.message_id is not None:
            attributes["messaging.message.id"] = str(item.message_id)
        # The envelope's CorrelationId (identity sets it on every event), where readable.
        correlation = (
            item.correlation_id
            if isinstance(item, MembershipChange)
            else item.fields.get("CorrelationId")
        )
        if correlation:
            attributes["messaging.message.conversation_id"] = str(correlation)
        receive = self.tracer.start_span(
            f"poll {self.topic}",
            context=extract_context(headers),
            kind=SpanKind.CLIENT,
            start_time=times.poll_started,
            attributes=attributes,
        )
        receive.end(end_time=times.polled)
        process = self.tracer.start_span(
            f"process {self.topic}",
            context=trace.set_span_in_context(receive),
            kind=SpanKind.CONSUMER,
            links=[Link(batch)],
            start_time=times.handed,
            attributes=attributes
            | self._attributes("process", "process")
            | {"rewards.membership.outcome": outcome.value},
        )
        if times.stored is not None:
            started, ended = times.stored
            storage = self.tracer.start_span(
                STORAGE_SPAN,
                context=trace.set_span_in_context(process, Context()),
                kind=SpanKind.CLIENT,
                start_time=started,
                attributes=STORAGE_ATTRIBUTES,
            )
            storage.end(end_time=ended)
        if outcome is Outcome.DEAD_LETTERED:
            process.set_status(Status(StatusCode.ERROR, "REWARDS_MEMBERSHIP_EVENT_INVALID"))
        process.end(end_time=times.committed)

    def _attributes(self, kind: str, name: str) -> dict[str, Any]:
        return {
            "messaging.system": "kafka",
            "messaging.operation.type": kind,
            "messaging.operation.name": name,
            "messaging.destination.name": self.topic,
            "messaging.consumer.group.name": self.group_id,
        }


def _has_traceparent(headers: Headers) -> bool:
    # A plain loop, not any(<generator>): this runs once per record.
    for name, _ in headers:  # noqa: SIM110
        if name == TRACEPARENT_HEADER:
            return True
    return False
