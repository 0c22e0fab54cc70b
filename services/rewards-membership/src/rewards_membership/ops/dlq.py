"""`rewards-membership dlq list|replay|resolve`: the dead letters as an operator sees them
(a table, or one JSON object per record), and the replay or resolve of the selected ones
(`--all`, or `--offset` with `--partition` when ambiguous) with a line per record and the
audit line of the change.

Exit codes: `dlq list` 0; `dlq replay` 1 when a record's original is gone or its copy
failed, or when the one record asked for was refused or is resolved; `dlq resolve` 0; both 2
when `--offset` names several partitions, 1 when it names no record.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Final

import msgspec
import psycopg
from confluent_kafka import Consumer
from psycopg.rows import TupleRow
from rich.console import Console

from pin_runtime.kafka import create_consumer
from pin_runtime.listing import Listing
from pin_runtime.logging import log_event
from pin_runtime.settings import CONFIG_ERROR_EXIT_CODE
from rewards_membership.app import create_replay_producer
from rewards_membership.dlq.reference import DeadLetterReference, decode_reference
from rewards_membership.dlq.replay import Replayer, ReplayResult, ReplayState
from rewards_membership.dlq.resolve import Resolver, ResolveResult, ResolveState
from rewards_membership.dlq.topic import (
    DeadLetterRecord,
    dead_letter_at,
    partitions_holding,
    read_dead_letters,
)
from rewards_membership.ops.tool import connect_tool, write_json
from rewards_membership.settings import SERVICE_NAME, Settings
from rewards_membership.store import Resolution, fetch_replays, fetch_resolutions

__all__ = [
    "DeadLetterRow",
    "RecordResult",
    "ResultTotals",
    "dead_letter_row",
    "dlq_list",
    "dlq_replay",
    "dlq_resolve",
]

# The audit lines (`dlq replayed`, `dlq resolved`) on the service's logger, as every command's.
_log = logging.getLogger(__name__)


def _tool_consumer(settings: Settings, role: str) -> Consumer:
    """An assign-only consumer of the tool (no group membership, nothing committed)."""
    return create_consumer(
        settings.kafka_bootstrap,
        group_id=f"{settings.group_id}-dlq-tool",
        client_id=f"{SERVICE_NAME}-dlq-{role}",
        extra=settings.kafka_security(),
    )


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode("utf-8", errors="replace")


_PAGE = 200
_COLUMNS = ("at", "state", "code", "key", "original", "value", "reason")


class DeadLetterRow(msgspec.Struct, frozen=True, kw_only=True):
    """One record of `dlq list` (its `--json` line; the table shows the same)."""

    partition: int
    offset: int
    state: str
    """pending, replayed <when>, or resolved <when>: <why>."""
    code: str | None
    key: str
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    value: str
    """Its size, or what a reference record says of the original it stands for."""
    reason: str


def dlq_list(settings: Settings, limit: int, *, as_json: bool = False) -> int:
    """Stream the DLQ page by page: a large DLQ is never held in memory whole."""
    console = Console()
    shown = pending = 0
    reader = _tool_consumer(settings, "list")
    try:
        with connect_tool(settings) as conn:
            records = itertools.islice(
                read_dead_letters(reader, settings.dlq_topic, timeout=10.0), limit
            )
            while page := list(itertools.islice(records, _PAGE)):
                positions = [(r.partition, r.offset) for r in page]
                replays = fetch_replays(conn, settings.dlq_topic, positions)
                resolutions = fetch_resolutions(conn, settings.dlq_topic, positions)
                rows = []
                for record, position in zip(page, positions, strict=True):
                    state = _state(replays.get(position), resolutions.get(position))
                    pending += state == "pending"
                    rows.append(dead_letter_row(record, state))
                shown += len(page)
                if as_json:
                    sys.stdout.writelines(msgspec.json.encode(r).decode() + "\n" for r in rows)
                    continue
                # A table where it fits the terminal, else a block per record.
                cells = [_cells(row, settings.topic) for row in rows]
                console.print(
                    Listing(
                        _COLUMNS, cells, show_header=shown == len(page), box=None, pad_edge=False
                    )
                )
    finally:
        reader.close()
    if as_json:
        return 0
    console.print(
        f"{settings.dlq_topic}: {shown} record(s), {pending} not replayed nor resolved"
        + (f" (first {limit} shown)" if shown == limit else "")
    )
    return 0


def _state(replayed_at: datetime | None, resolution: Resolution | None) -> str:
    """A record's state in `dlq list`: replayed, resolved (with why) or pending."""
    if replayed_at is not None:
        return f"replayed {replayed_at.isoformat(timespec='seconds')}"
    if resolution is not None:
        when = resolution.at.isoformat(timespec="seconds")
        return f"resolved {when}: {resolution.reason}"
    return "pending"


def dead_letter_row(record: DeadLetterRecord, state: str) -> DeadLetterRow:
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
    original = ""
    if row.original_topic is not None:
        # The topic only when it is not the consumer's own source topic.
        place = f"{row.original_partition}@{row.original_offset}"
        original = place if row.original_topic == source else f"{row.original_topic}[{place}]"
    return [
        f"{row.partition}@{row.offset}",
        row.state,
        row.code or "?",
        row.key,
        original,
        row.value,
        row.reason,
    ]


def _selected(
    reader: Consumer, settings: Settings, args: argparse.Namespace
) -> Iterable[DeadLetterRecord] | int:
    """`--all` as a stream, or the one record of `--offset` (`--partition`); else the exit
    code after one line saying why not."""
    if args.all:
        return read_dead_letters(reader, settings.dlq_topic, timeout=10.0)
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
    nothing could be selected."""
    say = _say_json if args.json else _say
    reader = _tool_consumer(settings, tool)
    source = _tool_consumer(settings, "source")
    try:
        records = _selected(reader, settings, args)
        if isinstance(records, int):
            return records
        counts: Counter[str] = Counter()
        with connect_tool(settings) as conn:
            for result in run(records, conn, source):
                counts[result.state] += 1
                say(result)
        return counts
    finally:
        reader.close()
        source.close()


def dlq_replay(settings: Settings, args: argparse.Namespace) -> int:
    replay_all, force = args.all, args.force
    producer = create_replay_producer(settings, client_id=f"{SERVICE_NAME}-dlq-replay")

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
    """The record at --offset (--partition), or the exit code after one line saying why not."""
    places = (
        [partition]
        if partition is not None
        else partitions_holding(reader, settings.dlq_topic, offset, timeout=10.0)
    )
    if len(places) > 1:
        listed = ", ".join(str(p) for p in places)
        sys.stderr.write(f"offset {offset} exists in partitions {listed}: pass --partition\n")
        return CONFIG_ERROR_EXIT_CODE
    record = (
        dead_letter_at(reader, settings.dlq_topic, places[0], offset, timeout=10.0)
        if places
        else None
    )
    if record is None:
        sys.stderr.write(f"no DLQ record at offset {offset}\n")
        return 1
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
