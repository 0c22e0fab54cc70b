"""`identity-fanout outbox status`: what waits in the outbox and who publishes it."""

from __future__ import annotations

from datetime import datetime

import msgspec
import psycopg
from psycopg.rows import TupleRow
from rich.table import Table

from identity_fanout import relay_queries as q
from identity_fanout.quarantine import quarantine_counts
from identity_fanout.relay import RELAY_LOCK_KEY


class RelayHolder(msgspec.Struct, frozen=True, kw_only=True):
    """The session holding the relay lock (from pg_locks / pg_stat_activity)."""

    pid: int
    application_name: str | None
    client_addr: str | None
    backend_start: datetime | None


class OutboxStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What `identity-fanout outbox status` prints."""

    backlog: int
    oldest_created_at: datetime | None
    """created_at of the next row to publish (lowest id)."""
    oldest_age_seconds: float | None
    by_topic: dict[str, int]
    relay_active: bool
    relay: RelayHolder | None
    quarantined: dict[str, int] = msgspec.field(default_factory=dict)
    """Rows Kafka refused for good, by topic (`outbox quarantine list`)."""


def outbox_status(conn: psycopg.Connection[TupleRow]) -> OutboxStatus:
    """Backlog, head age, per-topic counts, the relay lock holder and the quarantine."""
    by_topic: dict[str, int] = dict(conn.execute(q.STATUS_BY_TOPIC).fetchall())
    head = conn.execute(q.STATUS_HEAD).fetchone()
    high, low = (RELAY_LOCK_KEY >> 32) & 0xFFFFFFFF, RELAY_LOCK_KEY & 0xFFFFFFFF
    holder_row = conn.execute(q.LOCK_HOLDER, {"high": high, "low": low}).fetchone()
    holder = (
        RelayHolder(
            pid=holder_row[0],
            application_name=holder_row[1],
            client_addr=holder_row[2],
            backend_start=holder_row[3],
        )
        if holder_row is not None
        else None
    )
    return OutboxStatus(
        backlog=sum(by_topic.values()),
        oldest_created_at=head[0] if head else None,
        oldest_age_seconds=max(0.0, head[1]) if head else None,
        by_topic=by_topic,
        relay_active=holder is not None,
        relay=holder,
        quarantined=quarantine_counts(conn),
    )


def status_table(status: OutboxStatus) -> Table:
    """`identity-fanout outbox status` as a table."""
    table = Table(show_header=False, title="outbox", title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("backlog", str(status.backlog))
    table.add_row(
        "oldest",
        "-"
        if status.oldest_created_at is None
        else f"{status.oldest_created_at.isoformat(timespec='seconds')} "
        f"({status.oldest_age_seconds or 0.0:.1f}s ago)",
    )
    for topic, count in status.by_topic.items():
        table.add_row(f"topic {topic}", str(count))
    for topic, count in status.quarantined.items():
        table.add_row(f"quarantined {topic}", f"{count} (outbox quarantine list)")
    holder = status.relay
    table.add_row(
        "relay",
        "none holds the lock (nothing is being published)"
        if holder is None
        else f"active: pid {holder.pid}, {holder.application_name or '?'}"
        f" from {holder.client_addr or 'local socket'}",
    )
    return table
