"""Metrics, logs and per-record spans of a committed batch (only then: a failed one is
retried), and the `consumed` line of each record as it is handed to the database.

The log event names are the spec's (`consumed`, `membership-applied`, `skipped-duplicate`,
`skipped-stale-membership`, `dead-lettered`, ...), each with every field the spec names
(MessageId, AgentUserId, CompanyId, Status, Reason, Version: null where a refused record
does not hold it) and the event's correlation: its CorrelationId and the trace it belongs to
(`trace_id`: its producer's, from its traceparent; else the batch's). Counters move once
per batch.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from confluent_kafka import Message
from opentelemetry import trace

from pin_runtime.kafka import read_headers
from pin_runtime.logging import log_event
from rewards_membership.consumer.spans import BatchSpans
from rewards_membership.metrics import Metrics, contract_version_label
from rewards_membership.records import Record, event_fields, key_text, offset_of, partition_of
from rewards_membership.rules.plan import Outcome
from rewards_membership.rules.validation import (
    EXPECTED_CONTRACT_VERSION,
    InvalidEvent,
    Item,
    MembershipChange,
)

if TYPE_CHECKING:
    from rewards_membership.consumer.batch import Batch

__all__ = ["BatchReporter"]

_log = logging.getLogger(__name__)


class BatchReporter:
    """The metrics, logs and per-record spans of committed batches."""

    def __init__(self, *, metrics: Metrics, spans: BatchSpans) -> None:
        self._metrics = metrics
        self._spans = spans

    def consumed(self, batch: Batch, context: trace.SpanContext) -> None:
        """`consumed` (INFO) for every record handed to the database, valid or not, with its
        trace: its producer's (traceparent), else the batch's (`context`)."""
        if not _log.isEnabledFor(logging.INFO):
            return
        for record in batch.records():
            message = record.message
            log_event(
                _log,
                "consumed",
                **event_fields(record.item, message, context),
                partition=partition_of(message),
                offset=offset_of(message),
            )

    def report(self, batch: Batch) -> None:
        """A committed batch: its records (those of the partitions it committed) as they
        are reported, and each one's wait from its poll to its offset commit."""
        metrics = self._metrics
        done = batch.records()
        batch_context = batch.process.get_span_context()
        now = datetime.now(UTC).timestamp()
        oldest: float | None = None
        info = _log.isEnabledFor(logging.INFO)
        counts: Counter[tuple[Outcome, str]] = Counter()
        # One observation per message (the metric's help says so): every message of the
        # batch waited this long from its poll to its offset commit.
        elapsed_ms = (batch.committed - batch.polled) / 1e6
        observe = metrics.consume_duration_ms.observe
        for _ in range(len(done)):
            observe(elapsed_ms)
        earliest: datetime | None = None
        for record in done:
            message, item, outcome = record.message, record.item, record.outcome
            if outcome is None:
                raise ValueError(f"record {record.position} reported undecided")
            headers, unreadable = read_headers(message)
            self._spans.record(record, outcome, headers, batch)
            if unreadable is not None and outcome is not Outcome.DUPLICATE:
                self._report_unreadable_headers(item, message, unreadable, batch_context)
            if type(item) is MembershipChange:
                # The common case first, without a call per record: a valid event, no log
                # line at this level, no warning to raise.
                quiet = not (info or item.unknown_status or item.unknown_reason)
                if (
                    quiet
                    and item.contract_version == EXPECTED_CONTRACT_VERSION
                    and item.key_problem is None
                ):
                    counts[(outcome, item.status.value)] += 1
                else:
                    fields = event_fields(item, message, batch_context)
                    self._report_change(item, message, outcome, counts, fields, info=info)
                if earliest is None or item.occurred_at < earliest:
                    earliest = item.occurred_at
            elif isinstance(item, InvalidEvent):
                fields = event_fields(item, message, batch_context)
                self._report_invalid(record, item, outcome, counts, fields=fields)
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
        record: Record,
        item: InvalidEvent,
        outcome: Outcome,
        counts: Counter[tuple[Outcome, str]],
        *,
        fields: dict[str, Any],
    ) -> None:
        message = record.message
        place: dict[str, Any] = {
            "partition": partition_of(message),
            "offset": offset_of(message),
            "key": key_text(message),
        }
        if outcome is Outcome.DUPLICATE:
            # Dead-lettered before (its mark is in the inbox): not a second DLQ copy.
            counts[(outcome, "")] += 1
            log_event(_log, outcome.value, logging.INFO, **fields, **place)
            return
        receipt = record.receipt
        self._metrics.dlq.labels(item.error_code).inc()
        if receipt is not None and receipt.replaced is not None:
            self._metrics.dlq_replaced.labels(receipt.replaced).inc()
        log_event(
            _log,
            Outcome.DEAD_LETTERED.value,
            logging.ERROR,
            **fields,
            code=item.error_code,
            reason=item.message,
            **place,
            dlqPartition=receipt.dlq_partition if receipt else None,
            dlqOffset=receipt.dlq_offset if receipt else None,
            valueReplaced=receipt.replaced if receipt else None,
        )

    def _report_unreadable_headers(
        self, item: Item, message: Message, reason: str, batch: trace.SpanContext
    ) -> None:
        """Headers are no part of the contract: the record went its way by its value (and a
        dead letter of it carries no headers of its own), but a producer writes headers the
        client cannot read (a name not UTF-8), so the operator sees it, once per record."""
        log_event(
            _log,
            "record-headers-unreadable",
            logging.WARNING,
            **event_fields(item, message, batch),
            partition=partition_of(message),
            offset=offset_of(message),
            key=key_text(message),
            headersReason=reason,
        )

    def _report_change(
        self,
        item: MembershipChange,
        message: Message,
        outcome: Outcome,
        counts: Counter[tuple[Outcome, str]],
        fields: dict[str, Any],
        *,
        info: bool,
    ) -> None:
        counts[(outcome, item.status.value)] += 1
        if outcome is not Outcome.DUPLICATE:
            self._report_warnings(item, message, fields)
        if info:
            log_event(_log, outcome.value, **fields)

    def _report_warnings(
        self, item: MembershipChange, message: Message, fields: dict[str, Any]
    ) -> None:
        metrics = self._metrics
        if item.contract_mismatch:
            metrics.contract_mismatch.labels(contract_version_label(item.contract_version)).inc()
            log_event(
                _log,
                "contract-version-mismatch",
                logging.WARNING,
                expectedContractVersion=EXPECTED_CONTRACT_VERSION,
                ContractVersion=item.contract_version,
                **fields,
            )
        if item.key_problem is not None:
            # Applied all the same: the version guard keeps the row right whatever the order
            # a wrong key brought it in (docs/design/rewards-membership.md "Record keys").
            metrics.key_mismatch.labels(item.key_problem).inc()
            log_event(
                _log,
                "membership-key-mismatch",
                logging.WARNING,
                keyReason=item.key_problem,
                key=key_text(message),
                **fields,
            )
        if item.unknown_status:
            metrics.unknown_status.inc()
            log_event(_log, "unknown-membership-status", logging.WARNING, **fields)
        if item.unknown_reason:
            metrics.unknown_reason.inc()
            log_event(_log, "unknown-leave-reason", logging.WARNING, **fields)

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
