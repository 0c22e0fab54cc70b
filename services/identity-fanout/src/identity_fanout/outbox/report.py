"""What the relay tells operators about a round: metrics and log lines."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Sequence

from identity_fanout.outbox.metrics import RelayMetrics
from identity_fanout.outbox.quarantine import MovedRow
from identity_fanout.outbox.rules import Pause, Refusal, Settlement
from identity_fanout.outbox.tables import OutboxTables
from pin_runtime.delivery import DeliveryFailure
from pin_runtime.logging import log_event
from pin_runtime.postgres import is_retriable, report_auth_failure

__all__ = [
    "report_failed_round",
    "report_pause",
    "report_published",
    "report_quarantined",
    "report_refusals",
    "report_stopped",
]

_log = logging.getLogger(__name__)


def report_published(
    metrics: RelayMetrics,
    ids: Sequence[int],
    topics: Sequence[str],
    trace_ids: Sequence[str] = (),
) -> None:
    """`outbox published`: acknowledged rows just deleted (one line per delete batch), with
    `traceIds`: the traces that wrote them (their traceparent's; the first 32), the traces
    their consumers' lines carry."""
    metrics.published.inc(len(ids))
    if ids:
        log_event(
            _log,
            "outbox published",
            count=len(ids),
            firstId=min(ids),
            lastId=max(ids),
            topics=sorted(set(topics)),
            traceIds=list(trace_ids),
        )


def report_refusals(
    metrics: RelayMetrics,
    tables: OutboxTables,
    refusals: Sequence[Refusal],
    moved: Sequence[MovedRow],
) -> None:
    failures = {r.record.id: r.failure for r in refusals}
    for row in moved:
        report_quarantined(metrics, tables, row, failures[row.outbox_id])


def report_stopped(
    metrics: RelayMetrics,
    settlement: Settlement,
    *,
    published: int,
    quarantined: int,
    refused: bool = False,
) -> None:
    """`outbox delivery failed`: the rows from the first unsettled one on go out again.

    Counted once per stopped flow (the row it stopped on), never per row of the window that
    goes out again with it: counted per row, one refusal retried read as a flood of failures
    as large as the window at every retry. A flow `refused`
    by the cluster is counted but not logged: `report_pause` says it once per pause, where
    this line would come at every retry."""
    if settlement.stopped_at is None:
        return
    metrics.delivery_failures.inc()
    if refused:
        return
    log_event(
        _log,
        "outbox delivery failed",
        logging.WARNING,
        error=settlement.stop_reason(),
        failed=settlement.waiting,
        published=published,
        quarantined=quarantined,
        firstFailedId=settlement.stopped_at.id,
    )


def report_quarantined(
    metrics: RelayMetrics, tables: OutboxTables, row: MovedRow, failure: DeliveryFailure
) -> None:
    """`outbox row quarantined`: which row, whose (the key: an id), and why."""
    metrics.quarantined.labels(topic=row.topic, reason=failure.reason).inc()
    log_event(
        _log,
        "outbox row quarantined",
        logging.ERROR,
        **row.log_fields(tables),
        errorCode=failure.code,
        reason=failure.reason,
        error=failure.message,
    )


def report_pause(metrics: RelayMetrics, before: Pause | None, after: Pause | None) -> None:
    """`relay paused` (ERROR: a refusal of the cluster holds every row behind it; an
    operator must act) when a pause starts or its refusal changes, `relay resumed` when it
    ends; the paused gauge follows."""
    if after is before:
        return
    metrics.set_paused(None if after is None else (after.failure.reason, after.topic))
    if after is not None:
        log_event(
            _log,
            "relay paused",
            logging.ERROR,
            errorCode=after.failure.code,
            reason=after.failure.reason,
            topic=after.topic,
            error=after.failure.message,
            outboxId=after.outbox_id,
        )
    elif before is not None:
        log_event(
            _log,
            "relay resumed",
            logging.WARNING,
            errorCode=before.failure.code,
            reason=before.failure.reason,
            topic=before.topic,
            pausedSeconds=round(time.monotonic() - before.since, 3),
        )


def report_failed_round(metrics: RelayMetrics, exc: Exception, retry_in: float, *, dsn: str) -> str:
    """`relay round failed` (PostgreSQL, or a bug), or `database authentication failed`
    (ERROR, counted: PostgreSQL refused the login; an operator must fix the secret or the
    role, or the passfile is rewritten and the next connect reads it); the readiness detail
    it calls for."""
    refused = report_auth_failure(
        exc, dsn, metrics.database_auth_failures.inc, log=_log, retryInSeconds=round(retry_in, 3)
    )
    if refused is not None:
        return f"postgres: {refused}"
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
