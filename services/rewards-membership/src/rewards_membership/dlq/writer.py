"""Writing a batch's dead letters: each record once, a reference when the copy cannot go.

Every dead letter is tracked by its source position (partition, offset) with the shared
`DeliveryTracker`. What the broker acknowledged is remembered until the offset passes it,
so the retry of a batch whose DLQ write failed midway (or whose inbox marks could not be
written afterwards) writes only what is still missing: one DLQ copy per failure, not one
per retry. A copy refused for good (`classify(...).retriable is False`: too large) is
replaced by a reference record (`reference.py`). A copy that fails for a retriable reason
fails its own source partition only; the consumer pauses that one and commits the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Final

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from opentelemetry import trace

from pin_contracts import Headers
from pin_runtime.delivery import DeliveryFailure, DeliveryTracker
from pin_runtime.logging import log_event
from rewards_membership.dlq.reference import reference_for, reference_headers, sha256_hex
from rewards_membership.dlq.topic import dead_letter_info
from rewards_membership.records import (
    Position,
    Receipt,
    Record,
    event_fields,
    headers_of,
    offset_of,
    partition_of,
)
from rewards_membership.rules.validation import InvalidEvent

__all__ = ["DeadLetterResult", "DeadLetterer"]

_log = logging.getLogger(__name__)
# Extra wait after the producer's own message.timeout.ms (= delivery_timeout) has expired,
# for its final delivery reports to be served.
_REPORT_MARGIN: Final = 5.0


@dataclass(slots=True)
class DeadLetterResult:
    acknowledged: dict[Position, Receipt] = field(default_factory=dict)
    """Every record of the call that is in the DLQ (now or by an earlier try)."""
    failed: dict[int, DeliveryFailure] = field(default_factory=dict)
    """Source partition -> first failure of a record of it (retry the partition later)."""


_Outgoing = tuple[Message, Headers, bytes | None, str | None]
"""The source record, the DLQ copy's headers and value, the replacement reason if any."""


@dataclass(eq=False)
class DeadLetterer:
    producer: Producer
    _: KW_ONLY
    topic: str
    group_id: str
    delivery_timeout: float
    on_tick: Callable[[], None] | None = None
    _partitions: int | None = field(init=False, default=None)
    _acknowledged: dict[Position, Receipt] = field(init=False, default_factory=dict)

    def write(
        self, records: Sequence[Record], *, batch: trace.SpanContext | None = None
    ) -> DeadLetterResult:
        """Produce the dead letters of `records` (invalid ones) not in the DLQ yet, wait for
        the broker, say what landed. `batch`: the span of the batch the records came in (the
        trace of a log line about a record without a traceparent of its own, as in the
        batch's other lines)."""
        result = DeadLetterResult()
        todo = [r for r in records if r.position not in self._acknowledged]
        if todo:
            self._send(todo, result, batch)
        for record in records:
            receipt = self._acknowledged.get(record.position)
            if receipt is not None:
                result.acknowledged[record.position] = receipt
        return result

    def receipt(self, position: Position) -> Receipt | None:
        """Where the dead letter of `position` landed, if this process wrote it."""
        return self._acknowledged.get(position)

    def forget(self, partition: int, *, below: int | None = None) -> None:
        """Drop what is remembered of `partition` (all of it, or offsets below `below`)."""
        for position in [p for p in self._acknowledged if p[0] == partition]:
            if below is None or position[1] < below:
                del self._acknowledged[position]

    def _send(
        self,
        todo: Sequence[Record],
        result: DeadLetterResult,
        batch: trace.SpanContext | None,
    ) -> None:
        count = self._partition_count()
        if count is None:
            failure = DeliveryFailure(
                "_UNKNOWN_TOPIC", "retriable", f"DLQ topic {self.topic!r} unavailable", True
            )
            for record in todo:
                result.failed.setdefault(record.partition, failure)
            return
        infos = {r.position: dead_letter_info(r.message, _invalid(r), self.group_id) for r in todo}
        first = self._produce_round(
            [
                (
                    r.message,
                    headers_of(r.message) + infos[r.position].to_headers(),
                    r.message.value(),
                    None,
                )
                for r in todo
            ],
            count,
        )
        refused = {pos: f for pos, f in first.items() if not f.retriable}
        second: dict[Position, DeliveryFailure] = {}
        if refused:
            replacements = []
            for record in todo:
                message, position = record.message, record.position
                refusal = refused.get(position)
                if refusal is None:
                    continue
                info = infos[position]
                value = reference_for(info, message.value(), str(refusal))
                headers = reference_headers(headers_of(message), info, refusal.reason)
                replacements.append((message, headers, value, refusal.reason))
                log_event(
                    _log,
                    "dead-letter-value-replaced",
                    logging.WARNING,
                    **event_fields(record.item, message, batch),
                    partition=position[0],
                    offset=position[1],
                    size=len(message.value() or b""),
                    sha256=sha256_hex(message.value()),
                    code=refusal.code,
                    reason=refusal.reason,
                )
            second = self._produce_round(replacements, count)
        # Refused for good and replaced: only the reference's outcome counts.
        failures = {pos: f for pos, f in first.items() if f.retriable} | second
        for position, failure in sorted(failures.items()):
            if position not in self._acknowledged:
                result.failed.setdefault(position[0], failure)

    def _produce_round(
        self,
        records: Sequence[_Outgoing],
        partitions: int,
    ) -> dict[Position, DeliveryFailure]:
        """Produce and wait; the failures by position (acknowledgements are remembered)."""
        tracker = DeliveryTracker[Position]()
        for message, headers, value, replaced in records:
            position = _position(message)
            on_delivery = self._remember(tracker, position, replaced)
            try:
                self.producer.produce(
                    self.topic,
                    key=message.key(),
                    value=value,
                    partition=position[0] % partitions,
                    headers=headers,
                    on_delivery=on_delivery,
                )
            except (KafkaException, BufferError) as exc:
                tracker.refused(position, exc)
            self.producer.poll(0)
        # The producer gives up on a record after message.timeout.ms = delivery_timeout, so
        # nothing is written after this wait ends: a retry cannot add a second copy.
        tracker.wait(self.producer, self.delivery_timeout + _REPORT_MARGIN, on_tick=self.on_tick)
        failures = dict(tracker.failures)
        if tracker.pending:
            self.producer.purge(in_queue=True, in_flight=False)
            self.producer.poll(0)
            late = DeliveryFailure(
                "_MSG_TIMED_OUT", "retriable", "not acknowledged in time", retriable=True
            )
            for message, *_ in records:
                position = _position(message)
                if position not in self._acknowledged and position not in failures:
                    failures[position] = late
        return failures

    def _remember(
        self, tracker: DeliveryTracker[Position], position: Position, replaced: str | None
    ) -> Callable[[KafkaError | None, Message], None]:
        report = tracker.expect(position)

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            report(error, message)
            if error is None:
                self._acknowledged[position] = Receipt(
                    partition_of(message), offset_of(message), replaced
                )

        return on_delivery

    def _partition_count(self) -> int | None:
        if self._partitions is None:
            try:
                metadata = self.producer.list_topics(
                    self.topic, timeout=min(self.delivery_timeout, 10.0)
                )
            except KafkaException:
                return None
            topic = metadata.topics.get(self.topic)
            count = len(topic.partitions) if topic is not None and topic.error is None else 0
            if count == 0:
                return None
            self._partitions = count
        # Same partition number as the original (both topics have 3), wrapped if fewer.
        return self._partitions


def _position(message: Message) -> Position:
    return (partition_of(message), offset_of(message))


def _invalid(record: Record) -> InvalidEvent:
    if not isinstance(record.item, InvalidEvent):
        raise TypeError(f"not a dead letter: {record.position}")
    return record.item
