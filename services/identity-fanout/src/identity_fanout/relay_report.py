"""What the relay tells operators about a round: metrics and log lines."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from identity_fanout import relay_queries as q
from identity_fanout.quarantine import MovedRow, quarantine_counts
from identity_fanout.relay_metrics import RelayMetrics
from identity_fanout.relay_records import OutboxRecord
from identity_fanout.relay_settlement import Settlement
from pin_runtime.delivery import DeliveryFailure
from pin_runtime.logging import log_event
from pin_runtime.postgres import is_retriable

__all__ = [
    "BACKLOG_EXACT_UP_TO",
    "refresh_gauges",
    "report_failed_round",
    "report_quarantined",
    "report_round",
]

_log = logging.getLogger("identity_fanout.relay")

BACKLOG_EXACT_UP_TO: Final = 100_000
"""The backlog gauge counts rows exactly up to here, then reports the id span (cheap)."""

# The log field naming a quarantined row's key, by event type (ids only, never PII).
_KEY_FIELDS: Final = {"UserAccessChanged": "userId", "AgentMembershipChanged": "agentUserId"}


def report_round(
    metrics: RelayMetrics,
    records: Sequence[OutboxRecord],
    settlement: Settlement,
    moved: Sequence[MovedRow],
) -> None:
    """Counters and log lines of one settled round."""
    published = len(settlement.delete)
    metrics.published.inc(published)
    if published:
        log_event(
            _log,
            "outbox published",
            count=published,
            firstId=min(settlement.delete),
            lastId=max(settlement.delete),
            topics=sorted({r.topic for r in records}),
        )
    failures = {r.record.id: r.failure for r in settlement.quarantine}
    for row in moved:
        report_quarantined(metrics, row, failures[row.outbox_id])
    if settlement.stopped_at is not None:
        metrics.delivery_failures.inc(settlement.waiting)
        log_event(
            _log,
            "outbox delivery failed",
            logging.WARNING,
            error=settlement.stop_reason(),
            failed=settlement.waiting,
            published=published,
            quarantined=len(moved),
            firstFailedId=settlement.stopped_at.id,
        )


def report_quarantined(metrics: RelayMetrics, row: MovedRow, failure: DeliveryFailure) -> None:
    """`outbox row quarantined`: which row, whose (the key: an id), and why."""
    metrics.quarantined.labels(topic=row.topic, reason=failure.reason).inc()
    log_event(
        _log,
        "outbox row quarantined",
        logging.ERROR,
        outboxId=row.outbox_id,
        quarantineId=row.quarantine_id,
        topic=row.topic,
        eventType=row.event_type,
        messageId=str(row.message_id),
        **{_KEY_FIELDS.get(row.event_type, "messageKey"): row.key},
        errorCode=failure.code,
        reason=failure.reason,
        error=failure.message,
        attempts=row.attempts,
        sizeBytes=row.size,
    )


def report_failed_round(exc: Exception, retry_in: float) -> str:
    """`relay round failed` (PostgreSQL, or a bug); the readiness detail it calls for."""
    retriable = is_retriable(exc)
    reason = f"{type(exc).__name__}: {exc}".strip()
    log_event(
        _log,
        "relay round failed",
        logging.WARNING if retriable else logging.ERROR,
        error=reason,
        retriable=retriable,
        retryInSeconds=round(retry_in, 3),
        **({} if retriable else {"traceback": "".join(traceback.format_exception(exc))}),
    )
    return f"postgres: {reason}" if retriable else reason


def refresh_gauges(conn: psycopg.Connection[TupleRow], metrics: RelayMetrics) -> None:
    """Backlog, head age and quarantine gauges, read from the database (every round)."""
    row = conn.execute(q.BACKLOG, {"exact_up_to": BACKLOG_EXACT_UP_TO}).fetchone()
    if row is not None:
        counted, span, _oldest, age = row
        metrics.backlog.set(counted if counted < BACKLOG_EXACT_UP_TO else (span or counted))
        metrics.oldest_age_seconds.set(max(0.0, age) if age is not None else 0.0)
    metrics.set_quarantine_rows(quarantine_counts(conn))
