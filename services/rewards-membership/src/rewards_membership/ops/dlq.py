"""`rewards-membership dlq list|replay|resolve`: the dead letters as an operator sees them
(a table, or one JSON object per record), and the replay or resolve of the selected ones
(`--all`, or `--offset` with `--partition` when ambiguous) with a line per record and the
audit line of the change.

Exit codes: `dlq list` 0, or 1 when Kafka or the database could not be read (what the
other answers is listed: docs/design/rewards-membership.md "When a dependency is down");
`dlq replay` 1 when a record's original is gone or its copy failed, or when the one record
asked for was refused or is resolved; `dlq resolve` 0; both 2 when `--offset` names several
partitions, 1 when it names no record or `--partition` a partition the DLQ topic does not
have, and 1 when Kafka cannot be reached (nothing replayed nor resolved).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Final

import msgspec
import psycopg
from confluent_kafka import Consumer, KafkaException
from psycopg.rows import TupleRow
from rich.console import Console

from pin_runtime.composition import ERROR_EXIT_CODE, error_line
from pin_runtime.listing import Columns, Listing, timestamp_cell
from pin_runtime.logging import log_event
from pin_runtime.settings import CONFIG_ERROR_EXIT_CODE
from rewards_membership.app import replay_producer_config
from rewards_membership.dlq.reference import DeadLetterReference, decode_reference
from rewards_membership.dlq.replay import Replayer, ReplayResult, ReplayState
from rewards_membership.dlq.resolve import Resolver, ResolveResult, ResolveState
from rewards_membership.dlq.topic import (
    DeadLetterRecord,
    dead_letter_at,
    partitions_holding,
    read_dead_letters,
    topic_partitions,
)
from rewards_membership.errors import KafkaUnavailableError, TopicMissingError
from rewards_membership.ops.brokers import ToolKafka
from rewards_membership.ops.tool import (
    MISSING,
    cell,
    connect_tool,
    database_unavailable,
    say_unavailable,
    write_json,
)
from rewards_membership.rules.validation import IDEMPOTENCY_PREFIX
from rewards_membership.settings import SERVICE_NAME, Settings
from rewards_membership.store import (
    MembershipStore,
    Resolution,
    fetch_dead_letter_marks,
    fetch_replays,
    fetch_resolutions,
)

__all__ = [
    "DeadLetterMark",
    "DeadLetterRow",
    "RecordResult",
    "ResultTotals",
    "dead_letter_mark",
    "dead_letter_row",
    "dlq_list",
    "dlq_replay",
    "dlq_resolve",
]

# The audit lines (`dlq replayed`, `dlq resolved`) on the service's logger, as every command's.
_log = logging.getLogger(__name__)


# Each read of the DLQ (its metadata, its watermarks, the next record) waits this long.
_READ_TIMEOUT: Final = 10.0
# What a read of Kafka raises once the command has started and the brokers go away.
_KAFKA_FAILURES: Final = (KafkaException, TimeoutError)


def _tool_consumer(kafka: ToolKafka, role: str) -> Consumer:
    """An assign-only consumer of the tool (no group membership, nothing committed)."""
    return kafka.consumer(
        f"{SERVICE_NAME}-dlq-{role}", group_id=f"{kafka.settings.group_id}-dlq-tool"
    )


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode("utf-8", errors="replace")


_PAGE = 200
_COLUMNS = ("at", "state", "code", "key", "original", "value", "reason")


class DeadLetterRow(msgspec.Struct, frozen=True, kw_only=True):
    """One record of `dlq list` (its `--json` line; the table shows the same)."""

    partition: int
    offset: int
    state: str | None
    """pending, replayed <when>, or resolved <when>: <why>; None when the database that
    knows it could not be read."""
    code: str | None
    key: str
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    value: str
    """Its size, or what a reference record says of the original it stands for."""
    reason: str


class DeadLetterMark(msgspec.Struct, frozen=True, kw_only=True):
    """`dlq list` while Kafka cannot be read: a dead letter pending (not replayed nor
    resolved) as its inbox mark says (its `--json` line; the table shows the same)."""

    idempotency_key: str
    message_id: str | None
    """The MessageId its key names; None when no MessageId could be read of the record (its
    key is then its place, `original`)."""
    original: str | None
    """`topic[partition]@offset` of the record when its key is its place, else None."""
    dead_lettered_at: datetime
    """When its DLQ copy was acknowledged and the mark written."""
    state: str = "pending"


def dead_letter_mark(key: str, at: datetime) -> DeadLetterMark:
    """What an inbox key says of its dead letter: `<prefix><MessageId>`, or
    `<prefix>at:<topic>:<partition>:<offset>` (`rules.validation.position_key`)."""
    subject = key.removeprefix(IDEMPOTENCY_PREFIX)
    if not subject.startswith("at:"):
        return DeadLetterMark(
            idempotency_key=key, message_id=subject, original=None, dead_lettered_at=at
        )
    topic, _, place = subject.removeprefix("at:").rpartition(":")
    topic, _, partition = topic.rpartition(":")
    original = f"{topic}[{partition}]@{place}" if topic else subject
    return DeadLetterMark(
        idempotency_key=key, message_id=None, original=original, dead_lettered_at=at
    )


_MARK_COLUMNS: Columns[DeadLetterMark] = {
    "dead-lettered at": lambda m: timestamp_cell(m.dead_lettered_at),
    "state": lambda m: m.state,
    "message id": lambda m: cell(m.message_id),
    "original": lambda m: cell(m.original),
}


class _Pages:
    """`dlq list`'s rows from the DLQ itself, page by page as they are read, their states
    from the database's audit tables (none without a database: `state` None)."""

    def __init__(self, settings: Settings, *, as_json: bool) -> None:
        self.settings = settings
        self.as_json = as_json
        self.console = Console()
        self.shown = self.pending = 0

    def show(
        self, records: Iterator[DeadLetterRecord], conn: psycopg.Connection[TupleRow] | None
    ) -> None:
        dlq_topic = self.settings.dlq_topic
        while page := list(itertools.islice(records, _PAGE)):
            positions = [(r.partition, r.offset) for r in page]
            replays = fetch_replays(conn, dlq_topic, positions) if conn else {}
            resolutions = fetch_resolutions(conn, dlq_topic, positions) if conn else {}
            rows = []
            for record, position in zip(page, positions, strict=True):
                state = _state(replays.get(position), resolutions.get(position)) if conn else None
                self.pending += state == "pending"
                rows.append(dead_letter_row(record, state))
            self.shown += len(page)
            if self.as_json:
                sys.stdout.writelines(msgspec.json.encode(r).decode() + "\n" for r in rows)
                continue
            # A table where it fits the terminal, else a block per record.
            cells = [_cells(row, self.settings.topic) for row in rows]
            self.console.print(
                Listing(
                    _COLUMNS,
                    cells,
                    show_header=self.shown == len(page),
                    box=None,
                    pad_edge=False,
                )
            )

    def summary(self, limit: int, *, states: bool) -> None:
        if self.as_json:
            return
        counted = (
            f"{self.pending} not replayed nor resolved"
            if states
            else "their states unknown (database unavailable)"
        )
        self.console.print(
            f"{self.settings.dlq_topic}: {self.shown} record(s), {counted}"
            + (f" (first {limit} shown)" if self.shown == limit else "")
        )


def dlq_list(settings: Settings, limit: int, *, as_json: bool = False) -> int:
    """Stream the DLQ page by page: a large DLQ is never held in memory whole.

    Kafka down (or the DLQ topic missing): the dead letters pending by the database's marks
    instead; the database down: the records without their states. Either way one line on
    stderr says what could not be read, and the exit code is 1."""
    unavailable: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        conn: psycopg.Connection[TupleRow] | None = None
        try:
            conn = stack.enter_context(connect_tool(settings))
        except psycopg.OperationalError as exc:
            why = database_unavailable(exc)
            if why is None:
                raise
            unavailable["postgresql"] = why
        kafka = ToolKafka(settings, "dlq list")
        down = kafka.reach()
        if down is None:
            reader = _tool_consumer(kafka, "list")
            stack.callback(reader.close)
            pages = _Pages(settings, as_json=as_json)
            try:
                records = read_dead_letters(reader, settings.dlq_topic, timeout=_READ_TIMEOUT)
                pages.show(itertools.islice(records, limit), conn)
            except (*_KAFKA_FAILURES, TopicMissingError) as exc:
                down = str(exc) if isinstance(exc, TopicMissingError) else kafka.failure(exc)
                if pages.shown:
                    # Rows of the DLQ were shown: the database's list would repeat them.
                    return say_unavailable({"kafka": down, **unavailable})
            else:
                pages.summary(limit, states=conn is not None)
                return say_unavailable(unavailable)
        if conn is not None:
            _show_marks(conn, settings, limit, as_json=as_json)
        return say_unavailable({"kafka": down, **unavailable})


def _show_marks(
    conn: psycopg.Connection[TupleRow], settings: Settings, limit: int, *, as_json: bool
) -> None:
    """The dead letters pending by their inbox marks, the oldest first: what the database
    alone knows of the DLQ (not the records' codes nor reasons, which are on the topic)."""
    marks = [dead_letter_mark(key, at) for key, at in fetch_dead_letter_marks(conn, limit)]
    if as_json:
        for mark in marks:
            write_json(mark)
        return
    pending = MembershipStore.count_unreplayed(conn)
    console = Console()
    title = f"dead letters pending by the database (the records are on {settings.dlq_topic})"
    console.print(Listing.of(marks, _MARK_COLUMNS, title=title))
    console.print(
        f"{settings.dlq_topic}: unread (kafka unavailable), {pending} dead letter(s) pending"
        " by the database's marks"
        + (f" (first {len(marks)} shown)" if pending > len(marks) else "")
    )


def _state(replayed_at: datetime | None, resolution: Resolution | None) -> str:
    """A record's state in `dlq list`: replayed, resolved (with why) or pending."""
    if replayed_at is not None:
        return f"replayed {replayed_at.isoformat(timespec='seconds')}"
    if resolution is not None:
        when = resolution.at.isoformat(timespec="seconds")
        return f"resolved {when}: {resolution.reason}"
    return "pending"


def dead_letter_row(record: DeadLetterRecord, state: str | None) -> DeadLetterRow:
    """What `dlq list` shows of one dead letter: whatever its bytes, it is listed."""
    info = record.info
    replaced = record.replaced
    if replaced is not None:
        value = f"reference ({replaced})"
        reference = decode_reference(record.value)
        if isinstance(reference, DeadLetterReference):
            value = (
                f"reference ({replaced}, {reference.size} bytes, sha256 {reference.sha256[:12]})"
            )
    else:
        value = f"{len(record.value or b'')} bytes"
    return DeadLetterRow(
        partition=record.partition,
        offset=record.offset,
        state=state,
        code=info.error_code if info else None,
        key=_text(record.key),
        original_topic=info.original_topic if info else None,
        original_partition=info.original_partition if info else None,
        original_offset=info.original_offset if info else None,
        value=value,
        reason=info.exception_message if info else (record.problem or ""),
    )


def _cells(row: DeadLetterRow, source: str) -> list[str]:
    original = MISSING
    if row.original_topic is not None:
        # The topic only when it is not the consumer's own source topic.
        place = f"{row.original_partition}@{row.original_offset}"
        original = place if row.original_topic == source else f"{row.original_topic}[{place}]"
    return [
        f"{row.partition}@{row.offset}",
        cell(row.state),
        cell(row.code),
        cell(row.key),
        original,
        cell(row.value),
        cell(row.reason),
    ]


def _selected(
    reader: Consumer, settings: Settings, args: argparse.Namespace
) -> Iterable[DeadLetterRecord] | int:
    """`--all` as a stream, or the one record of `--offset` (`--partition`); else the exit
    code after one line saying why not."""
    if args.all:
        return read_dead_letters(reader, settings.dlq_topic, timeout=_READ_TIMEOUT)
    found = _one_record(reader, settings, args.offset, args.partition)  # argparse: required
    return found if isinstance(found, int) else [found]


# The count of each state in the audit line of `dlq replay` / `dlq resolve`, by log field.
_REPLAYED_FIELDS: Final = {
    "records": ReplayState.REPLAYED,
    "alreadyReplayed": ReplayState.ALREADY,
    "resolved": ReplayState.RESOLVED,
    "refused": ReplayState.REFUSED,
    "gone": ReplayState.GONE,
    "failed": ReplayState.FAILED,
}
_RESOLVED_FIELDS: Final = {
    "records": ResolveState.RESOLVED,
    "alreadyResolved": ResolveState.ALREADY,
    "alreadyReplayed": ResolveState.REPLAYED,
}


def _tally(counts: Counter[str], fields: Mapping[str, str]) -> dict[str, int]:
    return {field: counts[state] for field, state in fields.items()}


class RecordResult(msgspec.Struct, frozen=True, kw_only=True):
    """One record of `dlq replay` / `dlq resolve` (its `--json` line; the text line
    `P@O: result: detail` says the same)."""

    partition: int
    offset: int
    result: str
    """replayed, already-replayed, refused, would-replay, resolved, ...: its state."""
    detail: str
    """Where the copy went, when it was replayed or resolved before, why it was refused,
    ...; empty when the result says it all."""
    target_topic: str | None = None
    """Where a replay sent the copy (would send it, in a dry run); None otherwise."""
    target_partition: int | None = None
    target_offset: int | None = None


class ResultTotals(msgspec.Struct, frozen=True, kw_only=True):
    """The last `--json` line of `dlq replay` / `dlq resolve`: the records by result."""

    records: int
    results: dict[str, int]
    """Every result the command can give, with its count (0 included)."""
    dry_run: bool


def _totals(counts: Counter[str], states: Iterable[str], *, dry_run: bool) -> ResultTotals:
    return ResultTotals(
        records=sum(counts.values()),
        results={str(state): counts[state] for state in states},
        dry_run=dry_run,
    )


_Run = Callable[
    [Iterable[DeadLetterRecord], psycopg.Connection[TupleRow], Consumer],
    Iterable[ReplayResult | ResolveResult],
]


def _say_dry_run(count: int, done: str, nothing: str) -> None:
    # The audit line is the change's: a dry run writes none, and says so on stdout instead.
    sys.stdout.write(f"{count} record(s) would be {done} (dry run: nothing {nothing})\n")


def _over_dead_letters(
    settings: Settings, args: argparse.Namespace, tool: str, run: _Run
) -> Counter[str] | int:
    """Run `dlq replay` or `dlq resolve` (`run`) over the selected dead letters with a
    consumer of its own that reads their originals (`source`); one line per result (a JSON
    object with `--json`), and the results counted by state. The exit code instead when
    nothing could be selected.

    The database first, then Kafka: both are needed, and no record is read that could not
    be recorded. Kafka unreachable (now, or midway): `KafkaUnavailableError`, one line, exit
    1; what was done before is printed and recorded."""
    say = _say_json if args.json else _say
    kafka = ToolKafka(settings, f"dlq {tool}")
    with connect_tool(settings) as conn:
        down = kafka.reach()
        if down is not None:
            raise KafkaUnavailableError(f"{down} (nothing changed)")
        reader = _tool_consumer(kafka, tool)
        source = _tool_consumer(kafka, "source")
        try:
            records = _selected(reader, settings, args)
            if isinstance(records, int):
                return records
            counts: Counter[str] = Counter()
            for result in run(records, conn, source):
                counts[result.state] += 1
                say(result)
        except _KAFKA_FAILURES as exc:
            raise KafkaUnavailableError(kafka.failure(exc)) from None
        finally:
            reader.close()
            source.close()
    return counts


def dlq_replay(settings: Settings, args: argparse.Namespace) -> int:
    replay_all, force = args.all, args.force
    producer = ToolKafka(settings, "dlq replay").producer(
        replay_producer_config(settings, client_id=f"{SERVICE_NAME}-dlq-replay")
    )

    def replay(
        records: Iterable[DeadLetterRecord], conn: psycopg.Connection[TupleRow], source: Consumer
    ) -> Iterable[ReplayResult]:
        replayer = Replayer(
            producer=producer,
            source=source,
            conn=conn,
            dlq_topic=settings.dlq_topic,
            default_topic=settings.topic,
            delivery_timeout=settings.delivery_timeout.total_seconds(),
        )
        return replayer.replay(records, force=force, dry_run=args.dry_run)

    try:
        counts = _over_dead_letters(settings, args, "replay", replay)
    finally:
        producer.flush(settings.delivery_timeout.total_seconds())
    if isinstance(counts, int):
        return counts
    if args.json:
        write_json(_totals(counts, ReplayState, dry_run=args.dry_run))
    elif args.dry_run:
        _say_dry_run(counts[ReplayState.WOULD_REPLAY], "replayed", "sent")
    if not args.dry_run:
        log_event(_log, "dlq replayed", **_tally(counts, _REPLAYED_FIELDS), topic=settings.topic)
    if not replay_all and (counts[ReplayState.REFUSED] or counts[ReplayState.RESOLVED]):
        return 1
    return 1 if counts[ReplayState.GONE] or counts[ReplayState.FAILED] else 0


def dlq_resolve(settings: Settings, args: argparse.Namespace) -> int:
    def resolve(
        records: Iterable[DeadLetterRecord], conn: psycopg.Connection[TupleRow], source: Consumer
    ) -> Iterable[ResolveResult]:
        resolver = Resolver(conn=conn, source=source, dlq_topic=settings.dlq_topic)
        return resolver.resolve(records, reason=args.reason, dry_run=args.dry_run)

    counts = _over_dead_letters(settings, args, "resolve", resolve)
    if isinstance(counts, int):
        return counts
    if args.json:
        write_json(_totals(counts, ResolveState, dry_run=args.dry_run))
    elif args.dry_run:
        _say_dry_run(counts[ResolveState.WOULD_RESOLVE], "resolved", "written")
    if args.dry_run:
        return 0
    # The audit line: who closed dead letters without a replay, and why.
    log_event(
        _log,
        "dlq resolved",
        **_tally(counts, _RESOLVED_FIELDS),
        reason=args.reason,
        topic=settings.dlq_topic,
    )
    return 0


def _one_record(
    reader: Consumer, settings: Settings, offset: int, partition: int | None
) -> DeadLetterRecord | int:
    """The record at --offset (--partition), or the exit code after one line saying why not.

    `--partition` is checked against the partitions the DLQ topic has on the brokers now (an
    operator may have added some since the catalogue's count), not at parse time."""
    dlq_topic = settings.dlq_topic
    if partition is not None:
        partitions = topic_partitions(reader, dlq_topic, _READ_TIMEOUT)
        if partition not in partitions:
            listed = ", ".join(str(p) for p in partitions)
            error_line(
                f"error: --partition {partition}: the DLQ topic {dlq_topic} has no such"
                f" partition (it has {listed})"
            )
            return ERROR_EXIT_CODE
    places = (
        [partition]
        if partition is not None
        else partitions_holding(reader, dlq_topic, offset, timeout=_READ_TIMEOUT)
    )
    if len(places) > 1:
        listed = ", ".join(str(p) for p in places)
        error_line(f"error: offset {offset} exists in partitions {listed}: pass --partition")
        return CONFIG_ERROR_EXIT_CODE
    record = (
        dead_letter_at(reader, dlq_topic, places[0], offset, timeout=_READ_TIMEOUT)
        if places
        else None
    )
    if record is None:
        where = f" of partition {partition}" if partition is not None else ""
        error_line(f"error: no DLQ record at offset {offset}{where}")
        return ERROR_EXIT_CODE
    return record


def _say(result: ReplayResult | ResolveResult) -> None:
    """One line per record: stdout when it is settled (now or before), stderr when not."""
    record = result.record
    line = f"{record.partition}@{record.offset}: {result.state.value}"
    line += f": {result.detail}\n" if result.detail else "\n"
    settled = isinstance(result.state, ResolveState) or result.state in (
        ReplayState.REPLAYED,
        ReplayState.ALREADY,
        ReplayState.WOULD_REPLAY,
    )
    (sys.stdout if settled else sys.stderr).write(line)


def _say_json(result: ReplayResult | ResolveResult) -> None:
    """One JSON object per record, all on stdout: a script reads one stream (the exit code
    still says whether any record failed)."""
    record, target = result.record, result.target
    write_json(
        RecordResult(
            partition=record.partition,
            offset=record.offset,
            result=result.state.value,
            detail=result.detail,
            target_topic=target.topic if target else None,
            target_partition=target.partition if target else None,
            target_offset=target.offset if target else None,
        )
    )
