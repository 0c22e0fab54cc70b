"""Finishing an in-flight batch: its transaction's outcome, dead letters, marks, commit.

Runs on the poll thread (it owns every call on the Kafka consumer): it waits for the
batch's transaction on the database thread, then

1. writes the dead letters (`DeadLetterer`): each once, a reference record when the DLQ
   refuses the copy for good; a retriable failure fails only that record's partition;
2. marks the acknowledged dead letters in the inbox (on the database thread);
3. commits the offsets of every partition that finished: only now, after the database
   committed, so an offset never passes an uncommitted transaction;
4. pauses and seeks back the partitions that did not, each with its own backoff.

A database failure concerns the whole batch: every partition of it is paused and retried
after a `SELECT 1` probe. Partitions that left this instance meanwhile (`exclude`: lost)
are neither dead-lettered nor committed here: their next owner reads them again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import psycopg
from confluent_kafka import KafkaException, Message
from opentelemetry.trace import Status, StatusCode

from pin_runtime.errors import DeliveryError
from pin_runtime.http import ComponentState
from pin_runtime.postgres import is_retriable
from rewards_membership.consumer.db_thread import DatabaseThread
from rewards_membership.consumer.inflight import Finished, InFlight, finished_records
from rewards_membership.consumer.partitions import POSTGRESQL, PartitionControl
from rewards_membership.consumer.records import offset_of, partition_of
from rewards_membership.dlq.writer import DeadLetterer, DeadLetterResult, Position, Receipt
from rewards_membership.errors import ConcurrentApplyError, is_infrastructure
from rewards_membership.rules.plan import Outcome
from rewards_membership.rules.validation import InvalidEvent, Item

__all__ = ["BatchFinisher"]


@dataclass(eq=False, kw_only=True)
class BatchFinisher:
    database: DatabaseThread
    dead_letters: DeadLetterer
    partitions: PartitionControl
    database_state: ComponentState
    kafka_state: ComponentState

    def finish(
        self, batch: InFlight, *, now: float, exclude: Collection[int] = ()
    ) -> Finished | None:
        """The committed batch to report, or None when it failed (its partitions paused)."""
        assigned = self.partitions.assigned

        def ours(partition: int) -> bool:
            return partition in assigned and partition not in exclude

        try:
            plan = batch.plan.result()
            partitions = [p for p in batch.first if ours(p)]
            # The invalid records of our partitions (dead letters, and duplicates of ones
            # this process dead-lettered in an earlier try of the batch).
            kept = [
                (m, item, outcome)
                for m, item, outcome in zip(batch.records, batch.items, plan.outcomes, strict=True)
                if type(item) is InvalidEvent and partition_of(m) in partitions
            ]
            letters, receipts = self._dead_letter(kept)
            done = {p: batch.last[p] + 1 for p in partitions if p not in letters.failed}
            self.partitions.ledger.applied(done)
            self.partitions.commit(done, raise_errors=True)
        except Exception as exc:
            batch.process.end()
            if not is_infrastructure(exc):
                batch.receive.record_exception(exc)
                batch.receive.end()
                raise
            batch.receive.set_status(Status(StatusCode.ERROR, str(exc)))
            batch.receive.end()
            self.fail({p: o for p, o in batch.first.items() if ours(p)}, exc)
            return None
        batch.process.end()
        for partition, failure in letters.failed.items():
            # Only this partition: its dead letter could not be written.
            self.fail({partition: batch.first[partition]}, DeliveryError(str(failure)), batch=False)
        self.partitions.pauser.succeeded(done)
        self.database_state.ok()
        if "kafka" not in self.partitions.pauser.dependencies():
            self.kafka_state.ok()
        return Finished(
            done=finished_records(batch.records, batch.items, plan.outcomes, done, receipts),
            receipts=receipts,
            elapsed_ms=(now - batch.started) * 1000.0,
            receive=batch.receive,
        )

    def _dead_letter(
        self, kept: Sequence[tuple[Message, Item, Outcome]]
    ) -> tuple[DeadLetterResult, dict[Position, Receipt]]:
        """Write the batch's dead letters, mark the acknowledged ones in the inbox; say where
        every invalid record of the batch is in the DLQ (taken now: a commit forgets it)."""
        dead = [
            (m, item)
            for m, item, outcome in kept
            if isinstance(item, InvalidEvent) and outcome is Outcome.DEAD_LETTERED
        ]
        letters = self.dead_letters.write(dead)
        acknowledged = [item.key for m, item in dead if item.key and _at(m) in letters.acknowledged]
        self.database.mark_dead_lettered(acknowledged)
        receipts = {
            _at(m): receipt
            for m, item, _ in kept
            if isinstance(item, InvalidEvent)
            and (receipt := self.dead_letters.receipt(_at(m))) is not None
        }
        return letters, receipts

    def fail(self, first: dict[int, int], exc: BaseException, *, batch: bool = True) -> None:
        """Pause the partitions of `first` and seek them back to those offsets."""
        if not first:
            return
        dependency = _dependency(exc)
        reason = f"{type(exc).__name__}: {exc}".strip()[:300]
        if dependency == POSTGRESQL:
            self.database.discard()
            self.database_state.degraded(reason)
        else:
            self.kafka_state.degraded(reason)
        event = "batch rolled back, partitions paused" if batch else "dead letter not written"
        self.partitions.pause(first, dependency=dependency, reason=reason, event=event)


def _at(message: Message) -> Position:
    return (partition_of(message), offset_of(message))


def _dependency(exc: BaseException) -> str:
    if isinstance(exc, psycopg.Error | ConcurrentApplyError) or (
        not isinstance(exc, KafkaException | DeliveryError) and is_retriable(exc)
    ):
        return POSTGRESQL
    return "kafka"
