"""The consumer's spans, named and attributed by the OpenTelemetry messaging conventions
(`{operation} {destination}`, `messaging.operation.type` / `.name`), as the relay's are.

Per batch: `poll <topic>` (CLIENT, the receive; linked to the records' own traces), its
child `process <topic>` (CONSUMER), and below that the batch statement's span (`BatchApplier`),
started, not made current, since a batch's work spans two turns of the loop and two threads.

Per event that carries a trace context (spec "Наблюдаемость": receive -> process -> storage,
correlated from the event's metadata): in the event's own trace, under its producer's span,
`poll <topic>` -> `process <topic>` -> `STORAGE_SPAN`, each with the real times of its
batch's steps (`batch.Batch`), written once the batch committed: a batch that fails is
retried, and its records' spans are those of the try that committed them.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from pin_contracts import TRACEPARENT_HEADER, Headers
from pin_runtime.tracing import extract_context
from rewards_membership.records import Record, headers_of, key_text, offset_of, partition_of
from rewards_membership.rules.plan import Outcome
from rewards_membership.rules.validation import MembershipChange

if TYPE_CHECKING:
    from rewards_membership.consumer.batch import Batch

__all__ = ["STORAGE_ATTRIBUTES", "STORAGE_SPAN", "BatchSpans"]

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


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSpans:
    tracer: trace.Tracer
    topic: str
    group_id: str

    def start(self, batch: Batch) -> trace.Span:
        """The batch's `poll <topic>` span, linked to the records' own trace contexts (ended
        as the poll returned), and its `process <topic>` child, returned: the caller ends it
        when the batch committed or failed."""
        links = []
        count = len(batch)
        for record in islice(
            (r for part in batch.parts.values() for r in part.records), _MAX_LINKS
        ):
            context = trace.get_current_span(
                extract_context(headers_of(record.message))
            ).get_span_context()
            if context.is_valid:
                links.append(Link(context))
        receive = self.tracer.start_span(
            f"poll {self.topic}",
            kind=SpanKind.CLIENT,
            links=links,
            start_time=batch.poll_started,
            attributes=self._attributes("receive", "poll")
            | {
                "messaging.batch.message_count": count,
            },
        )
        receive.end(end_time=batch.polled)
        return self.tracer.start_span(
            f"process {self.topic}",
            context=trace.set_span_in_context(receive),
            kind=SpanKind.CONSUMER,
            attributes=self._attributes("process", "process")
            | {
                "messaging.batch.message_count": count,
            },
        )

    def record(self, record: Record, outcome: Outcome, headers: Headers, batch: Batch) -> None:
        """The event's receive -> process -> storage spans in its producer's trace (only for
        a record that carries one), with the real times of its batch's steps, written once
        the batch committed. `headers`: the record's, read once by the caller."""
        message, item = record.message, record.item
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
            start_time=batch.poll_started,
            attributes=attributes,
        )
        receive.end(end_time=batch.polled)
        process = self.tracer.start_span(
            f"process {self.topic}",
            context=trace.set_span_in_context(receive),
            kind=SpanKind.CONSUMER,
            links=[Link(batch.process.get_span_context())],
            start_time=batch.handed,
            attributes=attributes
            | self._attributes("process", "process")
            | {"rewards.membership.outcome": outcome.value},
        )
        if batch.stored is not None:
            started, ended = batch.stored
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
        process.end(end_time=batch.committed)

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
