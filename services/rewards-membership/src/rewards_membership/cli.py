"""`rewards-membership`: migrate, consume, dlq list|replay, agent show, inbox prune.

Settings are read and validated before anything else: a bad value prints one line naming the
variable and exits 2; bad arguments are argparse's exit 2 too.
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from pin_runtime.errors import SettingsError
from pin_runtime.http import Heartbeat
from pin_runtime.kafka import create_consumer
from pin_runtime.logging import configure_logging, log_event
from pin_runtime.settings import (
    CONFIG_ERROR_EXIT_CODE,
    parse_duration,
    settings_or_exit,
    unknown_variables,
)
from pin_runtime.shutdown import GracefulShutdown
from pin_runtime.tracing import configure_tracing, shutdown_tracing
from rewards_membership.app import build_consumer, create_dlq_producer, run_migrations, serving
from rewards_membership.display import display_status
from rewards_membership.dlq import DeadLetterRecord, read_dead_letters, replay
from rewards_membership.metrics import Metrics
from rewards_membership.settings import ENV_PREFIX, SERVICE_NAME, Settings
from rewards_membership.store import connect, fetch_agent_rows, prune_inbox

__all__ = ["main"]

_log = logging.getLogger("rewards_membership")


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _uuid(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a UUID: {text!r}") from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rewards-membership",
        description="PIN rewards: AgentMembershipChanged consumer and its tooling. "
        f"Configured by {ENV_PREFIX}* variables (see README).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("migrate", help="apply the rewards schema migrations")
    commands.add_parser("consume", help="run the membership consumer until SIGTERM/SIGINT")

    dlq = commands.add_parser("dlq", help="inspect and replay the dead-letter topic")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True)
    dlq_list = dlq_commands.add_parser("list", help="table of dead-lettered records")
    dlq_list.add_argument("--limit", type=int, default=1000, help="most rows shown")
    dlq_replay = dlq_commands.add_parser("replay", help="republish records to the source topic")
    which = dlq_replay.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every record of the DLQ")
    which.add_argument("--offset", type=int, help="the record at this DLQ offset")
    dlq_replay.add_argument(
        "--partition", type=int, help="DLQ partition of --offset (needed when ambiguous)"
    )

    agent = commands.add_parser("agent", help="the projection of one agent")
    agent_commands = agent.add_subparsers(dest="agent_command", required=True)
    show = agent_commands.add_parser("show", help="rows and derived display status")
    show.add_argument("agent_user_id", type=_uuid, metavar="AGENT_USER_ID")

    inbox = commands.add_parser("inbox", help="the idempotency store")
    inbox_commands = inbox.add_subparsers(dest="inbox_command", required=True)
    prune = inbox_commands.add_parser("prune", help="delete old idempotency marks")
    prune.add_argument(
        "--older-than", type=_duration, required=True, help="e.g. 30d, 12h (marks older go)"
    )
    return parser


def _require_kafka(settings: Settings) -> None:
    if not settings.kafka_bootstrap.strip():
        sys.stderr.write(
            f"config error: {ENV_PREFIX}KAFKA_BOOTSTRAP: required by this command but not set\n"
        )
        raise SystemExit(CONFIG_ERROR_EXIT_CODE)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_or_exit(Settings, ENV_PREFIX)
    configure_logging(settings.log_level, SERVICE_NAME)
    for variable in unknown_variables(Settings, ENV_PREFIX):
        log_event(_log, "unknown setting ignored", logging.WARNING, variable=variable)
    if args.command == "migrate":
        applied = run_migrations(settings.database_dsn.reveal())
        log_event(_log, "migrations applied", applied=applied)
        return 0
    if args.command == "consume":
        _require_kafka(settings)
        return _consume(settings)
    if args.command == "dlq":
        _require_kafka(settings)
        if args.dlq_command == "list":
            return _dlq_list(settings, args.limit)
        return _dlq_replay(
            settings, replay_all=args.all, offset=args.offset, partition=args.partition
        )
    if args.command == "agent":
        return _agent_show(settings, args.agent_user_id)
    return _inbox_prune(settings, args.older_than)


def _consume(settings: Settings) -> int:
    try:
        provider = configure_tracing(SERVICE_NAME)
    except SettingsError as exc:
        sys.stderr.write(f"config error: {exc.variable}: {exc.reason}\n")
        return CONFIG_ERROR_EXIT_CODE
    metrics = Metrics()
    heartbeat = Heartbeat(stale_after=max(60.0, 3 * settings.poll_timeout.total_seconds()))
    consumer, producer = build_consumer(settings, metrics=metrics, heartbeat=heartbeat)
    try:
        with GracefulShutdown() as stop, serving(settings, consumer, metrics, heartbeat):
            log_event(_log, "consumer starting", topic=settings.topic, group=settings.group_id)
            consumer.run(stop)
    finally:
        producer.flush(settings.delivery_timeout.total_seconds())
        shutdown_tracing(provider)
    return 0


def _read_dlq(settings: Settings) -> list[DeadLetterRecord]:
    consumer = create_consumer(
        settings.kafka_bootstrap,
        group_id=f"{settings.group_id}-dlq-tool",
        client_id=f"{SERVICE_NAME}-dlq-tool",
        extra=settings.kafka_security(),
    )
    try:
        return list(read_dead_letters(consumer, settings.dlq_topic, timeout=10.0))
    finally:
        consumer.close()


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode("utf-8", errors="replace")


def _dlq_list(settings: Settings, limit: int) -> int:
    records = _read_dlq(settings)
    table = Table(title=f"{settings.dlq_topic}: {len(records)} record(s)", title_justify="left")
    for column in ("partition", "offset", "code", "reason", "key", "original"):
        table.add_column(column, overflow="fold")
    for record in records[:limit]:
        info = record.info
        table.add_row(
            str(record.partition),
            str(record.offset),
            info.error_code if info else "?",
            info.exception_message if info else (record.problem or ""),
            _text(record.key),
            f"{info.original_topic}[{info.original_partition}]@{info.original_offset}"
            if info
            else "",
        )
    Console().print(table)
    return 0


def _dlq_replay(
    settings: Settings, *, replay_all: bool, offset: int | None, partition: int | None
) -> int:
    records = _read_dlq(settings)
    if not replay_all:
        records = [
            r
            for r in records
            if r.offset == offset and (partition is None or r.partition == partition)
        ]
        if not records:
            sys.stderr.write(f"no DLQ record at offset {offset}\n")
            return 1
        if len(records) > 1:
            places = ", ".join(str(r.partition) for r in records)
            sys.stderr.write(f"offset {offset} exists in partitions {places}: pass --partition\n")
            return CONFIG_ERROR_EXIT_CODE
    producer = create_dlq_producer(settings, client_id=f"{SERVICE_NAME}-dlq-replay")
    try:
        with Progress(
            TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), transient=False
        ) as progress:
            task = progress.add_task("replay", total=len(records))
            delivered = replay(
                producer,
                records,
                default_topic=settings.topic,
                delivery_timeout=settings.delivery_timeout.total_seconds(),
                on_sent=lambda _: progress.advance(task),
            )
    finally:
        producer.flush(settings.delivery_timeout.total_seconds())
    log_event(_log, "dlq replayed", records=delivered, topic=settings.topic)
    return 0


def _agent_show(settings: Settings, agent_user_id: uuid.UUID) -> int:
    with connect(
        settings.database_dsn.reveal(),
        application_name=f"{SERVICE_NAME}-cli",
        session=settings.database_session(),
    ) as conn:
        rows = fetch_agent_rows(conn, agent_user_id)
    console = Console()
    status = display_status((r["company_id"], r["membership_status"]) for r in rows)
    table = Table(title=f"agent {agent_user_id}: {status}", title_justify="left")
    columns = (
        "company_id",
        "membership_status",
        "leave_reason",
        "left_at",
        "effective_at",
        "first_activity_at",
        "last_activity_at",
        "last_membership_version",
        "version",
        "deals_closed_count",
        "fixations_count",
        "commission_accrued_amount",
        "commission_paid_amount",
    )
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if row[c] is None else str(row[c]) for c in columns))
    console.print(table)
    return 0


def _inbox_prune(settings: Settings, older_than: timedelta) -> int:
    with connect(
        settings.database_dsn.reveal(),
        application_name=f"{SERVICE_NAME}-cli",
        session=settings.database_session(),
    ) as conn:
        deleted = prune_inbox(conn, older_than, now=datetime.now(UTC))
    log_event(_log, "inbox pruned", deleted=deleted, olderThan=str(older_than))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
