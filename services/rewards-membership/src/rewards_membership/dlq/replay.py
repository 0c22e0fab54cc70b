"""`dlq replay`: republish dead letters to their source topic, each DLQ record once.

Per page of DLQ records: skip those `rewards.dlq_replays` says were replayed, and those
`dlq resolve` closed (`rewards.dlq_resolutions`) unless forced; read the
original back from the source topic for a reference record (and check its sha256); refuse a
record whose bytes fail validation again (unless forced); delete the records' dead-letter
inbox marks (so the consumer processes the copies instead of skipping them as duplicates);
republish (each copy on its key's partition by the topic catalogue's count, as identity's
relay publishes: docs/design/rewards-membership.md "Partitions"); and record, after the
broker acknowledged them, which DLQ records were replayed.
A copy the broker did not acknowledge gets its mark back: its record stays a dead letter
(counted by the unreplayed gauge, its alert firing) until a replay succeeds.
A crash between the acknowledgement and the record leaves at most one extra copy, which the
consumer skips as a duplicate of the first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from pin_contracts import AGENT_MEMBERSHIP_CHANGED, CATALOGUE, Headers, key_partition
from pin_runtime.delivery import DeliveryTracker
from rewards_membership.dlq.passes import DeadLetterPass, History
from rewards_membership.dlq.topic import (
    DeadLetterRecord,
    Handled,
    OriginalUnavailable,
    Target,
    read_original,
)
from rewards_membership.records import headers_of, offset_of, partition_of
from rewards_membership.rules.validation import InvalidEvent, position_key, validate
from rewards_membership.store import (
    Position,
    clear_dead_letter_marks,
    record_replays,
    restore_dead_letter_marks,
)

__all__ = ["ReplayResult", "ReplayState", "Replayer"]

_REPORT_MARGIN: Final = 5.0


class ReplayState(StrEnum):
    REPLAYED = "replayed"
    ALREADY = "already-replayed"
    RESOLVED = "resolved"
    """Closed by `dlq resolve`: skipped unless forced."""
    REFUSED = "refused"
    GONE = "gone"
    FAILED = "failed"
    WOULD_REPLAY = "would-replay"
    """`--dry-run`: it would be sent (to the topic named); nothing was."""


ReplayResult = Handled[ReplayState]


@dataclass(frozen=True, slots=True)
class _Copy:
    record: DeadLetterRecord
    topic: str
    value: bytes | None
    headers: Headers
    inbox_key: str | None


@dataclass(eq=False, kw_only=True)
class Replayer(DeadLetterPass):
    producer: Producer
    default_topic: str
    delivery_timeout: float

    def replay(
        self, records: Iterable[DeadLetterRecord], *, force: bool, dry_run: bool = False
    ) -> Iterator[ReplayResult]:
        """One result per record, page by page (the records may be a stream). `dry_run`:
        every check a replay makes, then WOULD_REPLAY instead of sending."""
        page = functools.partial(self._replay_page, force=force, dry_run=dry_run)
        return self.each_page(records, page)

    def _replay_page(
        self, page: Sequence[DeadLetterRecord], history: History, *, force: bool, dry_run: bool
    ) -> Iterator[ReplayResult]:
        done, resolved = history.replayed, history.resolved
        copies: list[_Copy] = []
        for record in page:
            at = done.get((record.partition, record.offset))
            if at is not None:
                yield ReplayResult(record, ReplayState.ALREADY, f"at {at.isoformat()}")
                continue
            resolution = resolved.get((record.partition, record.offset))
            if resolution is not None and not force:
                yield ReplayResult(
                    record,
                    ReplayState.RESOLVED,
                    f"at {resolution.at.isoformat()} ({resolution.reason}); "
                    "--force replays it anyway",
                )
                continue
            prepared = self._prepare(record, force=force)
            if isinstance(prepared, Handled):
                yield prepared
            else:
                copies.append(prepared)
        if copies and dry_run:
            for copy in copies:
                yield ReplayResult(
                    copy.record, ReplayState.WOULD_REPLAY, f"to {copy.topic}", Target(copy.topic)
                )
        elif copies:
            yield from self._send(copies, force=force)

    def _prepare(self, record: DeadLetterRecord, *, force: bool) -> _Copy | ReplayResult:
        info = record.info
        if info is None and not force:
            return ReplayResult(record, ReplayState.REFUSED, f"no DLQ headers: {record.problem}")
        value, headers = record.value, record.original_headers
        if record.replaced is not None:
            original = self._original(record)
            if isinstance(original, Handled):
                return original
            value, headers = original.value(), headers_of(original)
        item = validate(value)
        if isinstance(item, InvalidEvent) and not force:
            return ReplayResult(
                record,
                ReplayState.REFUSED,
                f"still invalid: {item.message} ({item.error_code}); --force replays it anyway",
            )
        key = item.key
        if key is None and info is not None:
            key = position_key(info.original_topic, info.original_partition, info.original_offset)
        topic = info.original_topic if info is not None else self.default_topic
        return _Copy(record, topic, value, headers, key)

    def _partition(self, topic: str, key: bytes | None) -> int:
        """The catalogue's partition of `key` on `topic` (the consumer's own source topic is
        the membership topic, whatever its name here); -1, librdkafka's choice, for a null
        key or a topic outside the catalogue."""
        counts = {t.name: t.partitions for t in CATALOGUE}
        counts[self.default_topic] = AGENT_MEMBERSHIP_CHANGED.partitions
        partitions = counts.get(topic)
        return -1 if partitions is None or not key else key_partition(key, partitions)

    def _original(self, record: DeadLetterRecord) -> Message | ReplayResult:
        original = read_original(self.source, record, timeout=self.read_timeout)
        if isinstance(original, OriginalUnavailable):
            state = ReplayState.GONE if original.gone else ReplayState.REFUSED
            return ReplayResult(record, state, original.detail)
        return original

    def _send(self, copies: Sequence[_Copy], *, force: bool) -> Iterator[ReplayResult]:
        # The consumer must not skip the copies as duplicates of the dead letters.
        with self.conn.transaction():
            cleared = clear_dead_letter_marks(
                self.conn, [c.inbox_key for c in copies if c.inbox_key]
            )
        tracker = DeliveryTracker[Position]()
        targets: dict[Position, Position] = {}
        for copy in copies:
            position = _pos(copy)
            try:
                self.producer.produce(
                    copy.topic,
                    key=copy.record.key,
                    value=copy.value,
                    headers=copy.headers,
                    partition=self._partition(copy.topic, copy.record.key),
                    on_delivery=_target_of(tracker, position, targets),
                )
            except (KafkaException, BufferError) as exc:
                tracker.refused(position, exc)
            self.producer.poll(0)
        tracker.wait(self.producer, self.delivery_timeout + _REPORT_MARGIN)
        acknowledged = [c for c in copies if (c.record.partition, c.record.offset) in targets]
        unsent = {
            key: cleared[key]
            for c in copies
            if _pos(c) not in targets and (key := c.inbox_key) is not None and key in cleared
        }
        with self.conn.transaction():
            # A copy the broker did not take leaves its record a dead letter, as before.
            restore_dead_letter_marks(self.conn, unsent)
            record_replays(
                self.conn,
                self.dlq_topic,
                [
                    ((c.record.partition, c.record.offset), c.inbox_key, c.topic, targets[_pos(c)])
                    for c in acknowledged
                ],
                forced=force,
            )
        for copy in copies:
            position = _pos(copy)
            if position in targets:
                target = targets[position]
                yield ReplayResult(
                    copy.record,
                    ReplayState.REPLAYED,
                    f"to {copy.topic}[{target[0]}]@{target[1]}",
                    Target(copy.topic, *target),
                )
            else:
                failure = tracker.failures.get(position)
                detail = str(failure) if failure is not None else "not acknowledged in time"
                yield ReplayResult(copy.record, ReplayState.FAILED, detail)


def _target_of(
    tracker: DeliveryTracker[Position], position: Position, targets: dict[Position, Position]
) -> Callable[[KafkaError | None, Message], None]:
    """The delivery callback: the tracker's, plus where the copy landed."""
    report = tracker.expect(position)

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        report(error, message)
        if error is None:
            targets[position] = (partition_of(message), offset_of(message))

    return on_delivery


def _pos(copy: _Copy) -> Position:
    return (copy.record.partition, copy.record.offset)
