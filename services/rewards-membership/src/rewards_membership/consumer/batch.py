"""A batch in flight, from its hand-over to the database thread to its report: which
records stay ours, finishing it (dead letters, marks, offset commit, pause and seek back),
reporting it. All of it is `Batches`.

The loop keeps at most one batch in flight (its transaction running on the database thread)
and one prefetched batch (polled and decoded meanwhile, not yet handed to the database
thread). The poll loop hands a decoded batch over (`Batches.start`) and later has it
finished (`Batches.finish`); `start` is only called after `finish`. Metrics, logs and spans
of a committed batch are written by `Batches.report`, after the next batch has started, so
they are never on the path from poll to commit. Each record goes from the batch statement's
decision to its report as one `decided.Decided`.

Which records stay ours is decided by the plain functions at the top of this module (pure,
no I/O). What the prefetched batch may keep depends on what happened while it waited:
records of a partition that was revoked or lost, or paused by the failure of the batch
before it, are dropped, never applied or committed by this instance.

Finishing a batch runs on the poll thread (it owns every call on the Kafka consumer): it
waits for the batch's transaction on the database thread, then

1. writes the dead letters (`DeadLetterer`): each once, a reference record when the DLQ
   refuses the copy for good; a retriable failure fails only that record's partition;
2. marks the acknowledged dead letters in the inbox (on the database thread);
3. commits the offsets of every partition that finished: only now, after the database
   committed, so an offset never passes an uncommitted transaction;
4. pauses and seeks back the partitions that did not, each with its own backoff.

A database failure concerns the whole batch: every partition of it is paused and retried
after a `SELECT 1` probe. A row locked elsewhere concerns the partitions whose records touch
it: the database thread applied the others in transactions of their own
(`database.Applied.contended`), so only those partitions are paused (cause `lock_timeout`,
no probe: the database answers) while the others are finished as above. Partitions that
left this instance meanwhile (`exclude`: lost) are neither dead-lettered nor committed
here: their next owner reads them again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
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
from rewards_membership.consumer.database import Applied, DatabaseThread
from rewards_membership.consumer.decided import Decided
from rewards_membership.consumer.partitions import LOCK_TIMEOUT, POSTGRESQL, PartitionControl
from rewards_membership.consumer.report import BatchReporter
from rewards_membership.consumer.spans import BatchTimes
from rewards_membership.dlq.writer import DeadLetterer, Position
from rewards_membership.errors import CommitInDoubtError, ConcurrentApplyError, is_infrastructure
from rewards_membership.records import offset_of, partition_of
from rewards_membership.rules.plan import Outcome
from rewards_membership.rules.validation import InvalidEvent, Item

__all__ = [
    "Batches",
    "Finished",
    "InFlight",
    "bounds",
    "first_offsets",
    "keep_partitions",
    "reseek_offsets",
]


@dataclass(slots=True, kw_only=True)
class InFlight:
    """A batch handed to the database thread, waiting to be finished (DLQ, marks, commit)."""

    records: Sequence[Message]
    items: Sequence[Item]
    first: dict[int, int]
    """Partition -> first offset of the batch: where a failed partition is sought back to."""
    last: dict[int, int]
    """Partition -> last offset of the batch."""
    poll_started: int
    polled: int
    handed: int
    """`time.time_ns()` when its poll began, returned, and it was handed to the database."""
    process: Span
    outcomes: Future[Applied]
    """Every record's outcome, in order, once the batch's transaction committed."""


@dataclass(slots=True, kw_only=True)
class Finished:
    """A committed batch whose metrics, logs and spans are written after the next one
    started (they are not on the path from poll to commit)."""

    done: list[Decided]
    times: BatchTimes
    process: Span
    """The batch's process span, ended (at its commit) once it was reported."""

    @property
    def elapsed_ms(self) -> float:
        """From its poll to its offset commit: what each of its messages waited."""
        return (self.times.committed - self.times.polled) / 1e6


def first_offsets(records: Sequence[Message]) -> dict[int, int]:
    return bounds(records)[0]


def bounds(records: Sequence[Message]) -> tuple[dict[int, int], dict[int, int]]:
    """Partition -> (first offset, last offset) of the records, in one pass."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for message in records:
        partition, offset = partition_of(message), offset_of(message)
        if partition not in first:
            first[partition] = offset
        last[partition] = offset
    return first, last


def keep_partitions(
    records: Sequence[Message], items: Sequence[Item], keep: Callable[[int], bool]
) -> tuple[list[Message], list[Item]]:
    """The records (and their decoded items) of the partitions `keep` accepts, in order."""
    if all(keep(p) for p in {m.partition() for m in records} if p is not None):
        return list(records), list(items)
    kept = [(m, i) for m, i in zip(records, items, strict=True) if keep(partition_of(m))]
    return [m for m, _ in kept], [i for _, i in kept]


def reseek_offsets(
    records: Sequence[Message],
    touched: Collection[int],
    assigned: Collection[int],
    paused: Collection[int],
) -> dict[int, int]:
    """Where to seek the partitions whose prefetched records are dropped although they are
    ours again (revoked or lost and assigned back during the same poll): their first dropped
    offset. A paused partition keeps the position its pause sought it to."""
    first = first_offsets([m for m in records if partition_of(m) in touched])
    return {p: o for p, o in first.items() if p in assigned and p not in paused}


@dataclass(eq=False, kw_only=True)
class Batches:
    """The batch in flight, from its hand-over to the database thread to its report.

    `start` hands a decoded batch over; `finish` finishes it (waits for its transaction,
    then dead letters, marks, offset commit, or pause and seek back); `report` writes the
    metrics, logs and spans of the batches finished since. `start` is only called after
    `finish`. Called by the poll loop, and by the revocation (`rebalance.RebalanceGuard`),
    which must commit what is applied before the partitions move.

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
    reporter: BatchReporter
    """Starts a batch's spans too (`reporter.spans`)."""
    database_state: ComponentState
    kafka_state: ComponentState
    in_flight: InFlight | None = field(init=False, default=None)
    _earlier: dict[Position, Outcome] = field(init=False, default_factory=dict)
    _unreported: list[Finished] = field(init=False, default_factory=list)

    def start(
        self,
        records: Sequence[Message],
        items: Sequence[Item],
        document: str | None = None,
        *,
        poll: tuple[int, int] | None = None,
    ) -> None:
        """Hand the batch (and its document, when encoded already) to the database thread;
        its transaction runs while the loop polls. `poll`: when the poll that returned it
        began and returned (`time.time_ns()`; now, when not said)."""
        handed = time.time_ns()
        poll_started, polled = poll or (handed, handed)
        process = self.reporter.spans.start(records, poll_started=poll_started, polled=polled)
        first, last = bounds(records)
        suspects = self.partitions.pauser.suspects.intersection(first)
        with trace.use_span(process, end_on_exit=False):
            # Each record's `consumed` line carries its trace: its producer's (traceparent),
            # else this batch's, the trace every later line of the record is in.
            self.reporter.consumed(records, items, process.get_span_context())
            outcomes = self.database.submit(
                items,
                document,
                # Asked on the database thread only when the batch is split.
                partitions=lambda: [partition_of(m) for m in records],
                suspects=suspects,
            )
        self.in_flight = InFlight(
            records=records,
            items=items,
            first=first,
            last=last,
            poll_started=poll_started,
            polled=polled,
            handed=handed,
            process=process,
            outcomes=outcomes,
        )

    def finish(self, exclude: Collection[int] = ()) -> None:
        """Finish the batch in flight, if any (waits for its transaction); `exclude` are
        partitions lost meanwhile, neither dead-lettered nor committed here. Its report
        waits for `report`."""
        batch, self.in_flight = self.in_flight, None
        if batch is None:
            return
        # Every line of its end (dead letters, a rollback, paused partitions) in its trace.
        with trace.use_span(
            batch.process, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            finished = self._finish(batch, exclude)
        if finished is not None:
            self._unreported.append(finished)

    def report(self) -> None:
        """Write the metrics, logs and spans of every batch finished since the last call."""
        unreported, self._unreported = self._unreported, []
        for finished in unreported:
            try:
                self.reporter.report(
                    finished.done,
                    elapsed_ms=finished.elapsed_ms,
                    batch_context=finished.process.get_span_context(),
                    times=finished.times,
                )
            finally:
                finished.process.end(end_time=finished.times.committed)

    def forget(self, partitions: Collection[int]) -> None:
        """The partitions left this instance: what is kept of them goes."""
        for at in [at for at in self._earlier if at[0] in partitions]:
            del self._earlier[at]
        for partition in partitions:
            self.dead_letters.forget(partition)

    def _finish(self, batch: InFlight, exclude: Collection[int]) -> Finished | None:
        """The committed batch to report, or None when it failed (its partitions paused)."""
        assigned = self.partitions.assigned

        def ours(partition: int) -> bool:
            return partition in assigned and partition not in exclude

        try:
            applied = batch.outcomes.result()
            stored, contended = applied.stored, applied.contended
            # The records whose transaction committed: all, or those of the partitions that
            # met no row lock held elsewhere.
            decided = _decided(batch, applied)
            partitions = [p for p in batch.first if ours(p) and p not in (contended or {})]
            failed, receipts = self._dead_letter(
                decided, partitions, batch.process.get_span_context()
            )
            done = {p: batch.last[p] + 1 for p in partitions if p not in failed}
            self.partitions.ledger.applied(done)
            self.partitions.commit(done, raise_errors=True)
            committed = time.time_ns()
        except Exception as exc:
            future = batch.outcomes
            ours_now = [p for p in batch.first if ours(p)]
            if future.done() and future.exception() is None:
                # The transaction committed; a later step failed: the retry finds these
                # records applied, and must still report them as what they were.
                self._remember(_decided(batch, future.result()), ours_now)
            elif isinstance(exc, CommitInDoubtError):
                # Committed or not: if it was, the retry finds the records in the inbox and
                # reports them as decided here; if not, it decides them anew (an earlier
                # outcome only ever replaces a duplicate).
                self._remember(_with_outcomes(batch.records, batch.items, exc.outcomes), ours_now)
            if not is_infrastructure(exc):
                batch.process.record_exception(exc)
                batch.process.end()
                raise
            batch.process.set_status(Status(StatusCode.ERROR, str(exc)))
            batch.process.end()
            self.fail({p: o for p, o in batch.first.items() if ours(p)}, exc)
            return None
        for partition, offset in done.items():
            # Committed: their receipts are never asked again.
            self.dead_letters.forget(partition, below=offset)
        # The partitions whose dead letter could not be written are read again, but their
        # other records committed with the batch: their retry reports those as what they
        # were (as after a failure above), not as duplicates of this try.
        self._remember(decided, failed)
        for partition, failure in failed.items():
            # Only this partition: its dead letter could not be written.
            self.fail({partition: batch.first[partition]}, DeliveryError(str(failure)), batch=False)
        for partition, error in (contended or {}).items():
            # Only this partition: a row of it is locked elsewhere (its part rolled back).
            if ours(partition):
                self.fail({partition: batch.first[partition]}, error, batch=False)
        if contended and not done:
            # Nothing of the batch committed: nothing to report.
            batch.process.set_status(Status(StatusCode.ERROR, "rows locked elsewhere"))
            batch.process.end()
            return None
        self.partitions.pauser.succeeded(done)
        self.database_state.ok()
        if "kafka" not in self.partitions.pauser.dependencies():
            self.kafka_state.ok()
        times = BatchTimes(batch.poll_started, batch.polled, batch.handed, stored, committed)
        return Finished(
            done=self._reported(decided, done, receipts=receipts),
            times=times,
            process=batch.process,
        )

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
        self, decided: Sequence[Decided], partitions: Collection[int], batch: trace.SpanContext
    ) -> tuple[Mapping[int, DeliveryFailure], bool]:
        """Write the dead letters of `partitions`, mark the acknowledged ones in the inbox;
        each invalid record of them gets its `receipt` (taken now: a commit forgets it).
        The partitions whose dead letter could not be written (with the failure), and
        whether any record got a receipt."""
        invalid = [d for d in decided if type(d.item) is InvalidEvent and d.partition in partitions]
        if not invalid:
            return {}, False
        dead = [
            (d.message, d.item)
            for d in invalid
            if isinstance(d.item, InvalidEvent) and d.outcome is Outcome.DEAD_LETTERED
        ]
        letters = self.dead_letters.write(dead, batch=batch)
        acknowledged = [item.key for m, item in dead if item.key and _at(m) in letters.acknowledged]
        self.database.mark_dead_lettered(acknowledged)
        receipts = False
        for d in invalid:
            d.receipt = self.dead_letters.receipt(d.position)
            receipts = receipts or d.receipt is not None
        return letters.failed, receipts

    def _remember(self, decided: Sequence[Decided], partitions: Collection[int]) -> None:
        """The outcomes of `partitions`' records, whose transaction committed and which are
        not reported now. A duplicate is not remembered: in a retry it is what an earlier
        try committed, whose outcome is remembered already (or was the first try's own)."""
        if not partitions:
            return
        for d in decided:
            if d.outcome is not Outcome.DUPLICATE and partition_of(d.message) in partitions:
                self._earlier[d.position] = d.outcome

    def _reported(
        self, decided: list[Decided], done: Mapping[int, int], *, receipts: bool
    ) -> list[Decided]:
        """The records of the partitions committed now, as they are reported: a dead letter
        this process wrote in an earlier try of the batch (marked, then the batch failed)
        is the dead letter it was, and a duplicate of what an earlier try committed is what
        that try decided (taken from what is kept: a partition retried again keeps it until
        that retry reports it)."""
        earlier = self._earlier
        whole = all(p in done for p in {d.message.partition() for d in decided})
        if whole and not receipts and not earlier:
            return decided  # the usual whole batch
        reported = []
        for d in decided:
            if d.partition not in done:
                continue
            before = earlier.pop(d.position, None) if earlier else None
            if d.receipt is not None:
                d.outcome = Outcome.DEAD_LETTERED
            elif d.outcome is Outcome.DUPLICATE and before is not None:
                d.outcome = before
            reported.append(d)
        return reported


def _decided(batch: InFlight, applied: Applied) -> list[Decided]:
    """The batch's records whose transaction committed (those of the partitions not
    `applied.contended`), each with its outcome."""
    records, items = batch.records, batch.items
    if applied.contended:
        contended = applied.contended
        records, items = keep_partitions(records, items, lambda p: p not in contended)
    return _with_outcomes(records, items, applied.outcomes)


def _with_outcomes(
    records: Sequence[Message], items: Sequence[Item], outcomes: Sequence[Outcome]
) -> list[Decided]:
    if not len(records) == len(items) == len(outcomes):
        raise ValueError(f"{len(outcomes)} outcome(s) for {len(records)} record(s)")
    return list(map(Decided, records, items, outcomes))


def _at(message: Message) -> Position:
    return (partition_of(message), offset_of(message))


def _dependency(exc: BaseException) -> str:
    if isinstance(exc, psycopg.Error | ConcurrentApplyError) or (
        not isinstance(exc, KafkaException | DeliveryError) and is_retriable(exc)
    ):
        return POSTGRESQL
    return "kafka"
