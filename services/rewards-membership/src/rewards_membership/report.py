"""Metrics, logs and per-record spans of a committed batch (only then: a failed one is retried).

The log event names are the spec's (`membership-applied`, `skipped-duplicate`,
`skipped-stale-membership`, `dead-lettered`, ...); counters move once per batch.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Message
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from pin_contracts import TRACEPARENT_HEADER
from pin_runtime.logging import log_event
from pin_runtime.tracing import extract_context
from rewards_membership.deadletter import Position, Receipt
from rewards_membership.metrics import Metrics, contract_version_label
from rewards_membership.plan import Outcome
from rewards_membership.records import key_text, offset_of, partition_of
from rewards_membership.validation import EXPECTED_CONTRACT_VERSION, InvalidEvent, MembershipChange

__all__ = ["BatchReporter", "Item"]

_log = logging.getLogger("rewards_membership.consumer")
Item = MembershipChange | InvalidEvent


class BatchReporter:
    def __init__(
        self, *, metrics: Metrics, tracer: trace.Tracer, topic: str, group_id: str
    ) -> None:
        self._metrics = metrics
        self._tracer = tracer
        self._topic = topic
        self._group_id = group_id

    def start_spans(self, records: Sequence[Message]) -> tuple[trace.Span, trace.Span]:
        """The batch's `<topic> receive` span, linked to the records' own trace contexts,
        and its `membership batch process` child.

        Started, not made current: a batch's work spans two turns of the loop and two
        threads (the process span and the `pg apply batch` span below it carry it
        explicitly)."""
        links = []
        for message in records[:_MAX_LINKS]:
            context = trace.get_current_span(extract_context(message.headers())).get_span_context()
            if context.is_valid:
                links.append(Link(context))
        receive = self._tracer.start_span(
            f"{self._topic} receive",
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "receive",
                "messaging.operation.name": "consume",
                "messaging.destination.name": self._topic,
                "messaging.consumer.group.name": self._group_id,
                "messaging.batch.message_count": len(records),
            },
        )
        process = self._tracer.start_span(
            "membership batch process",
            context=trace.set_span_in_context(receive),
            attributes={
                "messaging.operation.type": "process",
                "messaging.destination.name": self._topic,
                "messaging.batch.message_count": len(records),
            },
        )
        return receive, process

    def report(
        self,
        done: Sequence[tuple[Message, Item, Outcome]],
        receipts: Mapping[Position, Receipt],
        *,
        elapsed_ms: float,
        batch_context: trace.SpanContext,
    ) -> None:
        metrics = self._metrics
        now = datetime.now(UTC).timestamp()
        oldest: float | None = None
        info = _log.isEnabledFor(logging.INFO)
        debug = _log.isEnabledFor(logging.DEBUG)
        counts: Counter[tuple[Outcome, str]] = Counter()
        # One observation per batch: every message of it took this long from poll to commit.
        metrics.consume_duration_ms.observe(elapsed_ms)
        earliest: datetime | None = None
        for message, item, outcome in done:
            if _has_traceparent(message):
                self._process_span(message, item, outcome, batch_context)
            if type(item) is MembershipChange:
                # The common case first, without a call per record: a valid event, no log
                # line at this level, no warning to raise.
                quiet = not (info or debug or item.unknown_status or item.unknown_reason)
                if quiet and item.contract_version == EXPECTED_CONTRACT_VERSION:
                    counts[(outcome, item.status.value)] += 1
                else:
                    self._report_change(item, outcome, counts, info=info, debug=debug)
                if earliest is None or item.occurred_at < earliest:
                    earliest = item.occurred_at
            elif isinstance(item, InvalidEvent):
                self._report_invalid(message, item, outcome, receipts, counts)
                _, timestamp_ms = message.timestamp()
                event_time = timestamp_ms / 1000.0 if timestamp_ms > 0 else now
                oldest = max(oldest or 0.0, now - event_time)
        if earliest is not None:
            oldest = max(oldest or 0.0, now - earliest.timestamp())
        self._count(counts)
        if oldest is not None:
            metrics.lag_seconds.set(max(0.0, oldest))
        metrics.batch_size.observe(len(done))

    def _report_invalid(
        self,
        message: Message,
        item: InvalidEvent,
        outcome: Outcome,
        receipts: Mapping[Position, Receipt],
        counts: Counter[tuple[Outcome, str]],
    ) -> None:
        position = (partition_of(message), offset_of(message))
        place: dict[str, Any] = {
            "partition": partition_of(message),
            "offset": offset_of(message),
            "key": key_text(message),
        }
        if outcome is Outcome.DUPLICATE:
            # Dead-lettered before (its mark is in the inbox): not a second DLQ copy.
            counts[(outcome, "")] += 1
            log_event(
                _log, outcome.value, logging.INFO, MessageId=item.message_id, **item.fields, **place
            )
            return
        receipt = receipts.get(position)
        self._metrics.dlq.labels(item.error_code).inc()
        if receipt is not None and receipt.replaced is not None:
            self._metrics.dlq_replaced.labels(receipt.replaced).inc()
        log_event(
            _log,
            Outcome.DEAD_LETTERED.value,
            logging.ERROR,
            MessageId=item.message_id,
            **item.fields,
            code=item.error_code,
            reason=item.message,
            **place,
            dlqPartition=receipt.dlq_partition if receipt else None,
            dlqOffset=receipt.dlq_offset if receipt else None,
            valueReplaced=receipt.replaced if receipt else None,
        )

    def _report_change(
        self,
        item: MembershipChange,
        outcome: Outcome,
        counts: Counter[tuple[Outcome, str]],
        *,
        info: bool,
        debug: bool,
    ) -> None:
        if debug:
            log_event(_log, "consumed", logging.DEBUG, **_fields(item))
        counts[(outcome, item.status.value)] += 1
        if outcome is not Outcome.DUPLICATE:
            self._report_warnings(item)
        if info:
            log_event(_log, outcome.value, **_fields(item))

    def _report_warnings(self, item: MembershipChange) -> None:
        metrics = self._metrics
        if item.contract_mismatch:
            metrics.contract_mismatch.labels(contract_version_label(item.contract_version)).inc()
            log_event(
                _log,
                "contract-version-mismatch",
                logging.WARNING,
                expectedContractVersion=EXPECTED_CONTRACT_VERSION,
                ContractVersion=item.contract_version,
                **_fields(item),
            )
        if item.unknown_status:
            metrics.unknown_status.inc()
            log_event(_log, "unknown-membership-status", logging.WARNING, **_fields(item))
        if item.unknown_reason:
            metrics.unknown_reason.inc()
            log_event(_log, "unknown-leave-reason", logging.WARNING, **_fields(item))

    def _count(self, counts: Counter[tuple[Outcome, str]]) -> None:
        # Counters move once per batch, not per message: the hot loop stays cheap.
        metrics = self._metrics
        for (outcome, status), n in counts.items():
            if outcome is Outcome.APPLIED:
                metrics.applied.labels(status).inc(n)
            elif outcome is Outcome.STALE:
                metrics.skipped_stale.inc(n)
            else:
                metrics.skipped_duplicate.inc(n)

    def _process_span(
        self, message: Message, item: Item, outcome: Outcome, batch: trace.SpanContext
    ) -> None:
        """A per-message span continuing the producer's trace (only for traced messages)."""
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.destination.name": self._topic,
            "messaging.consumer.group.name": self._group_id,
            "messaging.destination.partition.id": str(partition_of(message)),
            "messaging.kafka.offset": offset_of(message),
            "rewards.membership.outcome": outcome.value,
        }
        key = key_text(message)
        if key is not None:
            attributes["messaging.kafka.message.key"] = key
        if item.message_id is not None:
            attributes["messaging.message.id"] = str(item.message_id)
        span = self._tracer.start_span(
            f"{self._topic} process",
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


def _fields(item: MembershipChange) -> dict[str, Any]:
    payload = item.payload
    return {
        "MessageId": item.message_id,
        "AgentUserId": payload.agent_user_id,
        "CompanyId": payload.company_id,
        "Status": payload.status,
        "Reason": payload.reason,
        "Version": payload.version,
        "MembershipId": payload.membership_id,
    }


_MAX_LINKS = 32
