"""The consumer's batch: one value from its poll to its report (`Batch`), and the one object
that hands it to the database thread, finishes it and reports it (`Batches`).

A batch is the records of one poll grouped by partition: each `Part` holds a partition's
records in offset order and their share of the batch statement's document, encoded once, on
the poll thread, while the batch before is in its transaction. Whatever happens to the
batch afterwards happens to whole partitions (dropped because they were paused or left,
applied apart after a lock timeout, committed, paused), so no record is encoded twice: the
statement's document is the parts' documents joined.

The loop keeps at most one batch in flight (its transaction running on the database thread)
and one prefetched batch (polled and decoded meanwhile, not yet handed over). `start` hands
a batch over, `finish` finishes it (its numbered steps are the order that keeps every
guarantee), `report` writes the metrics, logs and spans of the batches finished since:
after the next batch started, so they are never on the path from poll to commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import psycopg
from confluent_kafka import KafkaException, Message
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from psycopg.errors import LockNotAvailable

from pin_runtime.delivery import DeliveryFailure
from pin_runtime.errors import DeliveryError
from pin_runtime.http import ComponentState
from pin_runtime.postgres import causes, is_retriable
from rewards_membership.batch_sql import records_document
from rewards_membership.consumer.database import DatabaseThread
from rewards_membership.consumer.partitions import LOCK_TIMEOUT, POSTGRESQL, PartitionControl
from rewards_membership.consumer.report import BatchReporter
from rewards_membership.consumer.spans import BatchSpans
from rewards_membership.dlq.writer import DeadLetterer
from rewards_membership.errors import ConcurrentApplyError, is_infrastructure
from rewards_membership.records import Position, Record, offset_of, partition_of
from rewards_membership.rules.plan import Outcome
from rewards_membership.rules.validation import InvalidEvent

__all__ = ["Batch", "Batches", "Part"]


@dataclass(slots=True)
class Part:
    """One partition's records of a batch, in offset order, and their document."""

    records: list[Record]
    document: bytes
    """The records' `BatchRecord`s, a JSON array: the statement's document of any set of
    parts is their elements joined, never encoded again."""

    @property
    def first(self) -> int:
        """Where the partition is sought back to when the batch fails for it."""
        return offset_of(self.records[0].message)

    @property
    def last(self) -> int:
        return offset_of(self.records[-1].message)


@dataclass(eq=False, kw_only=True)
class Batch:
    """The records of one poll, from the poll to the report, and what became of them.

    The poll thread builds it (`polled`) and drops the parts of partitions it may no longer
    apply (`keep`); the database thread writes each record's outcome, when its statement
    ran (`stored`) and which partitions met a row lock held elsewhere (`contended`); the
    poll thread then finishes it, keeps only the partitions it committed and reports them.
    The times are `time.time_ns()`: the per-event spans carry them."""

    parts: dict[int, Part]
    poll_started: int
    polled: int
    """consume() returned it (its receive)."""
    handed: int = 0
    """Handed to the database thread (its processing began)."""
    process: Span = trace.INVALID_SPAN
    """Its `process <topic>` span, ended at its commit once it was reported."""
    transaction: Future[None] | None = None
    """Done once its transaction committed (or failed) on the database thread."""
    stored: tuple[int, int] | None = None
    """When the batch statement ran (None: nothing needed the database)."""
    contended: dict[int, LockNotAvailable] = field(default_factory=dict)
    """Partitions whose part met a row lock held elsewhere, rolled back (the error)."""
    committed: int = 0
    """Its offsets were committed (its processing ended)."""

    @classmethod
    def of(cls, messages: Iterable[Message], *, poll_started: int, polled: int) -> Batch:
        """The records validated, grouped by partition, and each part's document encoded."""
        grouped: dict[int, list[Record]] = {}
        records: list[Record] = []
        last: int | None = None
        of = Record.of
        for message in messages:
            # consume() returns each partition's records in runs: one lookup a run.
            if (partition := message.partition()) != last:
                records = grouped.setdefault(partition_of(message), [])
                last = partition
            records.append(of(message))
        parts = {
            partition: Part(records, records_document(r.item for r in records))
            for partition, records in grouped.items()
        }
        return cls(parts=parts, poll_started=poll_started, polled=polled)

    def keep(self, ours: Callable[[int], bool]) -> None:
        """Drop the parts of the partitions `ours` refuses."""
        if not all(ours(p) for p in self.parts):
            self.parts = {p: part for p, part in self.parts.items() if ours(p)}

    def records(self, partitions: Iterable[int] | None = None) -> list[Record]:
        """The records of `partitions` (of all), part after part."""
        chosen = self.parts if partitions is None else partitions
        return [r for p in chosen for r in self.parts[p].records]

    def document(self, partitions: Iterable[int] | None = None) -> bytes:
        """The batch statement's document of `partitions` (of all): `[{key, ...}, ...]`,
        their parts' elements copied once."""
        chosen = self.parts if partitions is None else partitions
        pieces: list[bytes | memoryview] = []
        for partition in chosen:
            pieces += (b",", memoryview(self.parts[partition].document)[1:-1])
        pieces[:1] = [b"["]  # the first comma, or nothing
        pieces.append(b"]")
        return b"".join(pieces)

    def __len__(self) -> int:
        return sum(len(part.records) for part in self.parts.values())


@dataclass(eq=False, kw_only=True)
class Batches:
    """The batch in flight, from its hand-over to the database thread to its report.

    `start` is only called after `finish`. Called by the poll loop, and by the revocation
    (`rebalance.RebalanceGuard`), which must commit what is applied before the partitions
    move.

    Outcomes of a try whose transaction committed but which failed after it (a dead-letter
    write, a mark, the offset commit) are kept by position until its retry reports them,
    instead of the duplicates the retry finds, so `membership-applied`, `applied_total` and
    the unknown-value warnings count each event once; `forget` drops them, with the DLQ
    receipts, when the partition leaves this instance (its next owner reports what it
    finds: duplicates).
    """

    database: DatabaseThread
    dead_letters: DeadLetterer
    partitions: PartitionControl
    spans: BatchSpans
    """Starts a batch's `poll` and `process` spans as it is handed over."""
    reporter: BatchReporter
    database_state: ComponentState
    kafka_state: ComponentState
    in_flight: Batch | None = field(init=False, default=None)
    _earlier: dict[Position, Outcome] = field(init=False, default_factory=dict)
    _unreported: list[Batch] = field(init=False, default_factory=list)

    def start(self, batch: Batch) -> None:
        """Hand the batch to the database thread; its transaction runs while the loop
        polls. Each record's `consumed` line is logged now, in the batch's span."""
        batch.handed = time.time_ns()
        batch.process = self.spans.start(batch)
        # Resumed after a row lock: tried apart from the others (`database.BatchApplier`).
        suspects = self.partitions.pauser.suspects.intersection(batch.parts)
        with trace.use_span(batch.process, end_on_exit=False):
            self.reporter.consumed(batch, batch.process.get_span_context())
            batch.transaction = self.database.submit(batch, suspects)
        self.in_flight = batch

    def finish(self, lost: Collection[int] = ()) -> None:
        """Finish the batch in flight, if any; `lost`: partitions lost meanwhile, neither
        dead-lettered nor committed here (their next owner reads them again). In order:

        1. wait for its transaction: every partition's records applied, or those of the
           partitions that met no row lock held elsewhere;
        2. write those partitions' dead letters, each once (a reference record when the
           DLQ refuses the copy for good); a retriable failure fails only its partition;
        3. mark the acknowledged dead letters in the inbox;
        4. commit the offsets of every partition that finished: only now, after the
           database committed, so an offset never passes an uncommitted transaction;
        5. pause and seek back the partitions that did not, each with its own backoff;
        6. keep the committed partitions' records, each as what it was, for `report`.

        A failure at 1, 3 or 4 concerns the whole batch: each of its partitions still ours
        is paused and sought back to its first record, retried after a `SELECT 1` probe
        when the database failed.
        """
        batch, self.in_flight = self.in_flight, None
        if batch is None or batch.transaction is None:
            return
        assigned = self.partitions.assigned
        ours = [p for p in batch.parts if p in assigned and p not in lost]
        # Every line of its end (dead letters, a rollback, paused partitions) in its trace.
        with trace.use_span(
            batch.process, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            try:
                # 1.
                batch.transaction.result()
                applied = [p for p in ours if p not in batch.contended]
                # 2, 3.
                failed, receipts = self._dead_letter(batch, applied)
                # 4.
                done = [p for p in applied if p not in failed]
                self.partitions.ledger.applied({p: batch.parts[p].last + 1 for p in done})
                self.partitions.commit(done, raise_errors=True)
                batch.committed = time.time_ns()
            except Exception as exc:
                # What committed (or may have: a COMMIT unanswered) is found in the inbox by
                # the retry, which must still report it as what it was.
                self._remember(batch, ours)
                if not is_infrastructure(exc):
                    batch.process.record_exception(exc)
                    batch.process.end()
                    raise
                batch.process.set_status(Status(StatusCode.ERROR, str(exc)))
                batch.process.end()
                self.fail({p: batch.parts[p].first for p in ours}, exc)
                return
            for partition in done:
                # Committed: their receipts are never asked again.
                self.dead_letters.forget(partition, below=batch.parts[partition].last + 1)
            # 5. A dead letter not written: the partition is read again, but its other
            # records committed with the batch, and its retry reports them as what they were.
            self._remember(batch, failed)
            for partition, failure in failed.items():
                first = {partition: batch.parts[partition].first}
                self.fail(first, DeliveryError(str(failure)), batch=False)
            for partition in ours:
                if partition in batch.contended:
                    # A row of it locked elsewhere: its part rolled back.
                    first = {partition: batch.parts[partition].first}
                    self.fail(first, batch.contended[partition], batch=False)
        if batch.contended and not done:
            # Nothing of the batch committed: nothing to report.
            batch.process.set_status(Status(StatusCode.ERROR, "rows locked elsewhere"))
            batch.process.end()
            return
        self.partitions.pauser.succeeded(done)
        self.database_state.ok()
        if "kafka" not in self.partitions.pauser.dependencies():
            self.kafka_state.ok()
        # 6.
        self._reported(batch, done, receipts=receipts)
        self._unreported.append(batch)

    def report(self) -> None:
        """Write the metrics, logs and spans of every batch finished since the last call."""
        unreported, self._unreported = self._unreported, []
        for batch in unreported:
            try:
                self.reporter.report(batch)
            finally:
                batch.process.end(end_time=batch.committed)

    def forget(self, partitions: Collection[int]) -> None:
        """The partitions left this instance: what is kept of them goes."""
        for at in [at for at in self._earlier if at[0] in partitions]:
            del self._earlier[at]
        for partition in partitions:
            self.dead_letters.forget(partition)

    def fail(self, first: dict[int, int], exc: BaseException, *, batch: bool = True) -> None:
        """Pause the partitions of `first` and seek them back to those offsets."""
        if not first:
            return
        dependency = _dependency(exc)
        reason = f"{type(exc).__name__}: {exc}".strip()[:300]
        event = "batch rolled back, partitions paused" if batch else "dead letter not written"
        cause = None
        if any(isinstance(e, LockNotAvailable) for e in causes(exc)):
            # A lock held elsewhere: the database answers (the connection stays, readiness
            # too); the partitions wait for the lock, with their backoff.
            cause, event = LOCK_TIMEOUT, "rows locked elsewhere, partitions paused"
        elif dependency == POSTGRESQL:
            self.database.discard()
            self.database_state.degraded(reason)
        else:
            self.kafka_state.degraded(reason)
        self.partitions.pause(first, dependency=dependency, reason=reason, event=event, cause=cause)

    def _dead_letter(
        self, batch: Batch, partitions: Collection[int]
    ) -> tuple[Mapping[int, DeliveryFailure], bool]:
        """Write the dead letters of `partitions`, mark the acknowledged ones in the inbox;
        each invalid record of them gets its `receipt` (taken now: a commit forgets it).
        The partitions whose dead letter could not be written (with the failure), and
        whether any record got a receipt."""
        invalid = [r for r in batch.records(partitions) if type(r.item) is InvalidEvent]
        if not invalid:
            return {}, False
        dead = [r for r in invalid if r.outcome is Outcome.DEAD_LETTERED]
        letters = self.dead_letters.write(dead, batch=batch.process.get_span_context())
        acknowledged = letters.acknowledged
        self.database.mark_dead_lettered(
            [key for r in dead if (key := r.item.key) and r.position in acknowledged]
        )
        receipts = False
        for record in invalid:
            record.receipt = self.dead_letters.receipt(record.position)
            receipts = receipts or record.receipt is not None
        return letters.failed, receipts

    def _remember(self, batch: Batch, partitions: Collection[int]) -> None:
        """The outcomes of `partitions`' records whose transaction committed (or may have),
        which are not reported now. A duplicate is not remembered: in a retry it is what an
        earlier try committed, whose outcome is remembered already (or was the first try's
        own)."""
        for record in batch.records(p for p in partitions if p in batch.parts):
            outcome = record.outcome
            if outcome is not None and outcome is not Outcome.DUPLICATE:
                self._earlier[record.position] = outcome

    def _reported(self, batch: Batch, done: Sequence[int], *, receipts: bool) -> None:
        """Keep the parts of the partitions committed now, their records as they are
        reported: a dead letter this process wrote in an earlier try of the batch (marked,
        then the batch failed) is the dead letter it was, and a duplicate of what an earlier
        try committed is what that try decided (taken from what is kept: a partition retried
        again keeps it until that retry reports it)."""
        batch.keep(set(done).__contains__)
        earlier = self._earlier
        if not receipts and not earlier:
            return  # the usual batch
        for record in batch.records():
            before = earlier.pop(record.position, None) if earlier else None
            if record.receipt is not None:
                record.outcome = Outcome.DEAD_LETTERED
            elif record.outcome is Outcome.DUPLICATE and before is not None:
                record.outcome = before


def _dependency(exc: BaseException) -> str:
    if isinstance(exc, psycopg.Error | ConcurrentApplyError) or (
        not isinstance(exc, KafkaException | DeliveryError) and is_retriable(exc)
    ):
        return POSTGRESQL
    return "kafka"
