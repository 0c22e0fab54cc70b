"""The consumer's partitions: which are paused and until when, what may be committed, and
the Kafka side of both (pause and seek back, resume, commit, rebalance).

The decisions are pure classes (`PartitionPauser`, `OffsetLedger`: no clock, no broker,
their tests need neither); `PartitionControl` applies them to the confluent-kafka
consumer. Rebalance safety: the pause state of every assigned partition is stated
explicitly on assignment (librdkafka keeps a pause flag across a lost and re-assigned
partition), applied offsets are committed on revoke, and everything known of a partition
is forgotten when it leaves.

A paused partition is also told to the brokers: its position is committed again with a
`PauseNote` as the offset's metadata, which `rewards-membership status` reads with the
group's offsets. The note stays on the brokers when the consumer is gone (the question
"which partitions are stuck, why, since when" is asked then too) and the partition's next
commit, after a batch of it succeeded, clears it.
"""

from __future__ import annotations

import datetime
import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pin_runtime.backoff import Backoff
from pin_runtime.http import CheckResult
from pin_runtime.logging import log_event
from rewards_membership.metrics import Metrics

# Commit errors of a group between generations: the commit may be retried once it settled.
_REBALANCING: Final = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.UNKNOWN_MEMBER_ID,
    }
)

__all__ = ["LOCK_TIMEOUT", "PAUSE_REASONS", "PartitionControl", "PauseNote", "pause_note_of"]

_log = logging.getLogger(__name__)
POSTGRESQL = "postgresql"
LOCK_TIMEOUT = "lock_timeout"
"""The cause of a pause for a row of the partition locked elsewhere (SQLSTATE 55P03): the
database answers, only that partition waits."""
PAUSE_REASONS: Final = (POSTGRESQL, "kafka", LOCK_TIMEOUT)
"""Why a partition is paused, as the gauge, `/readyz` and `status` name it: the dependency
that is unavailable, or the lock its rows wait for."""


def seek_back(consumer: Consumer, tp: TopicPartition) -> bool:
    """Rewind a partition to `tp.offset`, so its records are read again. False, logged,
    when the client refuses: the partition left this instance (its next owner reads it from
    the committed offset), or it was assigned so recently that its fetch has not started
    (`_STATE`: it will start from the committed offset)."""
    try:
        consumer.seek(tp)
    except KafkaException as error:
        log_event(
            _log, "seek back failed", logging.WARNING, partition=tp.partition, reason=str(error)
        )
        return False
    return True


class PauseNote(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Why and since when a consumer paused a partition, committed as the metadata of the
    partition's offset (compact JSON, well below the brokers' `offset.metadata.max.bytes`
    of 4096)."""

    paused: str
    """The dependency that failed: postgresql, kafka (the DLQ)."""
    reason: str
    cause: str | None = None
    """`lock_timeout`: a row of the partition is locked elsewhere (the dependency answers);
    None: the dependency is unavailable."""
    since: float
    """Unix time (s) the partition was first paused (kept across its retries)."""
    retry_at: float
    """Unix time (s) of its next retry."""
    attempts: int
    host: str
    """The consumer's host (its pod) that paused it."""


_NOTE_REASON_CHARS: Final = 300
_NOTE_TIMEOUT: Final = 5.0
"""Seconds to learn the committed position of a paused partition that has nothing applied
to commit (the failure path only, one request per pause)."""
_NOTE_DECODER: Final = msgspec.json.Decoder(PauseNote)


def pause_note_of(metadata: str | None) -> PauseNote | None:
    """The note a consumer committed with a partition's offset; None for none or another's."""
    if not metadata:
        return None
    try:
        return _NOTE_DECODER.decode(metadata)
    except msgspec.DecodeError:
        return None


class PartitionControl:
    def __init__(
        self,
        consumer: Consumer,
        *,
        topic: str,
        pauser: PartitionPauser,
        metrics: Metrics,
        clock: Callable[[], float],
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self.pauser = pauser
        self.ledger = OffsetLedger()
        self._metrics = metrics
        self._clock = clock
        self.assigned: set[int] = set()
        self.paused_now: tuple[PausedNow, ...] = ()
        """The paused partitions as `/readyz` shows them: replaced whole on every change,
        so the ops server's thread reads it without a lock."""
        for label in PAUSE_REASONS:
            metrics.paused_by_reason.labels(label).set(0)

    def pause(
        self,
        first: Mapping[int, int],
        *,
        dependency: str,
        reason: str,
        event: str,
        cause: str | None = None,
    ) -> None:
        """Pause each partition still ours until its backoff ends, sought back to `first[p]`.

        A partition is paused whether or not its seek went through: once the client holds
        it paused, only `resume_due` resumes it, so the pause must be known here. A seek the
        client refused (a partition assigned a moment ago, its fetch not started) is made
        again at the resume.
        """
        now = self._clock()
        delays = []
        for partition, offset in sorted(first.items()):
            if partition not in self.assigned:
                continue  # gone meanwhile: its next owner reads it from the committed offset
            tp = TopicPartition(self._topic, partition, offset)
            try:
                self._consumer.pause([tp])
            except KafkaException as error:
                log_event(
                    _log, "pause failed", logging.WARNING, partition=partition, reason=str(error)
                )
                continue
            seek_back(self._consumer, tp)
            pause = self.pauser.pause(
                partition,
                seek_to=offset,
                dependency=dependency,
                reason=reason,
                now=now,
                cause=cause,
            )
            delays.append(round(pause.retry_at - now, 3))
        self._metrics.retries.labels(dependency).inc()
        self._paused_changed()
        self._note(sorted(first), now)
        log_event(
            _log,
            event,
            logging.WARNING,
            dependency=dependency,
            cause=cause,
            reason=reason,
            partitions=sorted(first),
            firstOffsets=dict(first),
            retryInSeconds=max(delays) if delays else None,
        )

    def resume_due(self, probe: Callable[[], bool]) -> None:
        """Resume partitions whose backoff ended (after a probe, when the database failed)."""
        now = self._clock()
        due = self.pauser.due(now)
        if not due:
            return
        # A partition waiting for a row lock is retried without a probe: the database answers.
        waiting_db = [p for p in due if self._waits_for_database(p)]
        if waiting_db and not probe():
            for partition in waiting_db:
                pause = self.pauser.postpone(partition, now=now)
            self._note(waiting_db, now)
            self._metrics.retries.labels(POSTGRESQL).inc()
            log_event(
                _log,
                "dependency still down",
                logging.WARNING,
                dependency=POSTGRESQL,
                retryInSeconds=round(pause.retry_at - now, 3),
                attempt=pause.attempts,
            )
            due = [p for p in due if p not in waiting_db]
        if due:
            for partition in due:
                held = self.pauser.get(partition)
                if held is not None and held.seek_to is not None:
                    # Again: the seek at the pause may have been refused. If this one is too,
                    # the fetch has not started yet and will start at the committed offset,
                    # which is never past a record not yet applied.
                    tp = TopicPartition(self._topic, partition, held.seek_to)
                    seek_back(self._consumer, tp)
            self._consumer.resume([TopicPartition(self._topic, p) for p in due])
            self.pauser.resume(due)
            log_event(_log, "partitions resumed", partitions=due)
        self._paused_changed()

    def _paused_changed(self) -> None:
        """The gauges and `/readyz`'s view after a partition was paused or resumed."""
        self._metrics.paused_partitions.set(len(self.pauser.paused))
        counts = self.pauser.by_reason()
        for label in PAUSE_REASONS:
            self._metrics.paused_by_reason.labels(label).set(counts.get(label, 0))
        wall = time.time() - self._clock()  # the pauser's clock is monotonic
        self.paused_now = tuple(
            PausedNow(
                partition=partition,
                reason=pause.label,
                since=_iso(pause.since + wall),
                retry_at=_iso(pause.retry_at + wall),
                attempts=pause.attempts,
            )
            for partition, pause in sorted(self.pauser.items())
        )

    def readiness(self) -> CheckResult:
        """`/readyz`'s `partitions` check: ready (the other partitions are served; a
        dependency that is down degrades its own check), with every paused partition, why,
        since when and its next retry."""
        paused = [msgspec.structs.asdict(p) for p in self.paused_now]
        return CheckResult("ok", public={"paused": paused})

    def _note(self, partitions: Sequence[int], now: float) -> None:
        """Commit each paused partition's position again with its `PauseNote`.

        The position is where the partition resumes: the offset it was sought back to (the
        failed batch's first record of it: everything before is finished, or this consumer
        would never read it again), else what the ledger has applied, else what the group
        committed last (asked of the brokers); a partition paused on assignment that the
        group never committed gets no note. Never lower than the ledger's applied offset.
        Best effort: a note that cannot be committed (the brokers are what failed) is
        logged and the pause goes on.
        """
        pauses = {p: pause for p in partitions if (pause := self.pauser.get(p)) is not None}
        if not pauses:
            return
        applied = self.ledger.committable(pauses)
        offsets = dict(applied)
        for partition, pause in pauses.items():
            if pause.seek_to is not None:
                offsets[partition] = max(pause.seek_to, offsets.get(partition, 0))
        try:
            unknown = [TopicPartition(self._topic, p) for p in pauses if p not in offsets]
            if unknown:
                for tp in self._consumer.committed(unknown, timeout=_NOTE_TIMEOUT):
                    if tp.error is None and tp.offset >= 0:
                        offsets[tp.partition] = tp.offset
            wall = time.time() - now  # the pauser's clock is monotonic
            host = socket.gethostname()
            notes = [
                TopicPartition(
                    self._topic,
                    partition,
                    offset,
                    metadata=msgspec.json.encode(
                        PauseNote(
                            paused=pauses[partition].dependency,
                            reason=pauses[partition].reason[:_NOTE_REASON_CHARS],
                            cause=pauses[partition].cause,
                            since=round(pauses[partition].since + wall, 3),
                            retry_at=round(pauses[partition].retry_at + wall, 3),
                            attempts=pauses[partition].attempts,
                            host=host,
                        )
                    ).decode(),
                )
                for partition, offset in sorted(offsets.items())
            ]
            if notes:
                self._consumer.commit(offsets=notes, asynchronous=False)
        except KafkaException as exc:
            log_event(_log, "pause note not committed", logging.WARNING, reason=str(exc))
            return
        # What the ledger had applied is committed now, as by `commit`.
        self.ledger.committed(applied)

    def _waits_for_database(self, partition: int) -> bool:
        pause = self.pauser.get(partition)
        return pause is not None and pause.dependency == POSTGRESQL and pause.cause is None

    def commit(self, partitions: Iterable[int] | None = None, *, raise_errors: bool) -> None:
        """Commit the ledger's offsets (of `partitions`); synchronous."""
        offsets = self.ledger.committable(partitions)
        if not offsets:
            return
        tps = [TopicPartition(self._topic, p, o) for p, o in offsets.items()]
        try:
            self._consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code in _REBALANCING:
                # The group is rebalancing: the records are applied (the inbox has them), so
                # the offsets stay in the ledger and go with the next commit (the next batch,
                # or the revocation). Failing the batch instead would read it again for
                # nothing. Should the partition move first, its next owner skips them as
                # duplicates.
                log_event(_log, "offset commit deferred", reason=str(exc), offsets=offsets)
                return
            if code != KafkaError._NO_OFFSET:
                if raise_errors:
                    raise
                log_event(_log, "offset commit failed", logging.WARNING, reason=str(exc))
                return
        self.ledger.committed(offsets)

    # -- rebalance callbacks ---------------------------------------------------------------

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        numbers = [tp.partition for tp in partitions]
        self.assigned.update(numbers)
        database_down = self.pauser.down(POSTGRESQL)
        if database_down is not None and partitions:
            # The database is down: new partitions wait with the others until the retry.
            consumer.pause(partitions)
            for partition in numbers:
                self.pauser.hold(partition, database_down, now=self._clock())
        elif partitions:
            consumer.resume(partitions)
        self._paused_changed()
        log_event(
            _log, "partitions assigned", partitions=numbers, paused=sorted(self.pauser.paused)
        )

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        # Everything applied is committed before the partition moves to its next owner.
        self.commit(numbers, raise_errors=False)
        self.forget(numbers)
        log_event(_log, "partitions revoked", partitions=numbers)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        self.forget(numbers)
        log_event(_log, "partitions lost", logging.WARNING, partitions=numbers)

    def forget(self, numbers: Sequence[int]) -> None:
        """What this control knows of the partitions; the rebalance guard has the batch and
        the lag reporter forget theirs."""
        self.ledger.forget(numbers)
        self.pauser.forget(numbers)
        self.assigned.difference_update(numbers)
        self._paused_changed()


class PausedNow(msgspec.Struct, frozen=True, kw_only=True):
    """A paused partition as `/readyz` shows it: numbers, a reason word and times only."""

    partition: int
    reason: str
    """One of `PAUSE_REASONS`."""
    since: str
    retry_at: str
    """UTC, ISO 8601, to the second."""
    attempts: int


def _iso(unix: float) -> str:
    return datetime.datetime.fromtimestamp(unix, datetime.UTC).isoformat(timespec="seconds")


# -- which partitions are paused (pure) ----------------------------------------------------

# Which partitions are paused, why, since when and until when: pure bookkeeping.
#
# A partition is paused when a failure keeps its records from being finished: a database
# outage pauses every partition of the batch, a dead letter that cannot be written or a row
# locked elsewhere (cause `lock_timeout`) pauses only its own. Each partition has its own
# backoff (1 s -> 60 s), so one partition failing again and again does not slow the retries
# of the others. The consumer does the Kafka side
# (pause, seek, resume); this class only decides, and takes the time as an argument so its
# tests need no clock and no broker.


@dataclass(slots=True)
class Pause:
    """One paused partition."""

    dependency: str
    """What failed: postgresql (probed before resuming), kafka."""
    reason: str
    since: float
    """When the partition was first paused (kept across retries until it resumes)."""
    retry_at: float
    seek_to: int | None
    """The offset it resumes from: its first record of the failed batch (None: a partition
    paused on assignment, which resumes from its committed offset)."""
    attempts: int = field(default=1)
    cause: str | None = None
    """`LOCK_TIMEOUT`: a row of the partition is locked elsewhere, the database answers (no
    probe before the retry; the dependency is not down); None: the dependency failed."""

    @property
    def label(self) -> str:
        """Why it is paused, one of `PAUSE_REASONS`."""
        return self.cause or self.dependency


class PartitionPauser:
    def __init__(self, *, initial: float, maximum: float) -> None:
        self._initial = initial
        self._maximum = maximum
        self._pauses: dict[int, Pause] = {}
        self._backoffs: dict[int, Backoff] = {}
        self._suspects: set[int] = set()

    def _backoff(self, partition: int) -> Backoff:
        backoff = self._backoffs.get(partition)
        if backoff is None:
            backoff = self._backoffs[partition] = Backoff(
                initial=self._initial, maximum=self._maximum
            )
        return backoff

    def pause(
        self,
        partition: int,
        *,
        seek_to: int | None,
        dependency: str,
        reason: str,
        now: float,
        cause: str | None = None,
    ) -> Pause:
        """Pause (or keep paused) `partition` until its next backoff delay has passed."""
        delay = self._backoff(partition).next_delay()
        current = self._pauses.get(partition)
        pause = Pause(
            dependency=dependency,
            reason=reason,
            since=current.since if current is not None else now,
            retry_at=now + delay,
            seek_to=seek_to,
            attempts=self._backoffs[partition].attempts,
            cause=cause,
        )
        self._pauses[partition] = pause
        return pause

    def hold(self, partition: int, like: Pause, *, now: float) -> Pause:
        """Pause a newly assigned partition until `like`'s retry (its dependency is down)."""
        pause = Pause(
            dependency=like.dependency,
            reason=like.reason,
            since=now,
            retry_at=like.retry_at,
            seek_to=None,
        )
        self._pauses[partition] = pause
        return pause

    def postpone(self, partition: int, *, now: float) -> Pause:
        """A retry that found the dependency still down: wait the next delay."""
        pause = self._pauses[partition]
        return self.pause(
            partition,
            seek_to=pause.seek_to,
            dependency=pause.dependency,
            reason=pause.reason,
            now=now,
            cause=pause.cause,
        )

    def due(self, now: float) -> list[int]:
        """Paused partitions whose retry time has come, in partition order."""
        return sorted(p for p, pause in self._pauses.items() if pause.retry_at <= now)

    def resume(self, partitions: Iterable[int]) -> None:
        """The partitions are read again; their backoff continues until a batch succeeds.
        One paused for a row lock is a suspect until then (`suspects`)."""
        for partition in partitions:
            pause = self._pauses.pop(partition, None)
            if pause is not None and pause.cause == LOCK_TIMEOUT:
                self._suspects.add(partition)

    def succeeded(self, partitions: Iterable[int]) -> None:
        """A batch of these partitions was committed: their next failure starts at 1 s."""
        for partition in partitions:
            backoff = self._backoffs.get(partition)
            if backoff is not None:
                backoff.reset()
            self._suspects.discard(partition)

    def forget(self, partitions: Iterable[int]) -> None:
        """Revoked or lost: the next owner starts afresh."""
        for partition in partitions:
            self._pauses.pop(partition, None)
            self._backoffs.pop(partition, None)
            self._suspects.discard(partition)

    def get(self, partition: int) -> Pause | None:
        return self._pauses.get(partition)

    def items(self) -> list[tuple[int, Pause]]:
        return list(self._pauses.items())

    @property
    def suspects(self) -> frozenset[int]:
        """Partitions resumed after a pause for a row lock whose batch has not succeeded
        since: their records are tried in transactions of their own, at a short lock
        timeout, so a lock still held costs the other partitions no lock timeout."""
        return frozenset(self._suspects)

    def by_reason(self) -> dict[str, int]:
        """How many partitions are paused, per `Pause.label`."""
        counts: dict[str, int] = {}
        for pause in self._pauses.values():
            counts[pause.label] = counts.get(pause.label, 0) + 1
        return counts

    def is_paused(self, partition: int) -> bool:
        return partition in self._pauses

    @property
    def paused(self) -> frozenset[int]:
        return frozenset(self._pauses)

    def paused_for(self, now: float) -> dict[int, float]:
        """Seconds each paused partition has been paused."""
        return {p: max(0.0, now - pause.since) for p, pause in self._pauses.items()}

    def down(self, dependency: str) -> Pause | None:
        """A pause for `dependency` (the earliest retry), if that dependency is down (a pause
        for a row lock says nothing of the database)."""
        pauses = [
            p for p in self._pauses.values() if p.dependency == dependency and p.cause is None
        ]
        return min(pauses, key=lambda p: p.retry_at) if pauses else None

    def dependencies(self) -> set[str]:
        return {pause.dependency for pause in self._pauses.values()}


# -- what may be committed (pure) ----------------------------------------------------------

# What is applied and may be committed, per partition: pure bookkeeping of offsets.
#
# An offset enters the ledger once its batch is applied in the database and its dead letters
# are acknowledged; it leaves when Kafka confirmed the commit. Whatever sits in the ledger is
# committed before a revoked partition moves on (rebalance safety) and on shutdown.


class OffsetLedger:
    def __init__(self) -> None:
        self._pending: dict[int, int] = {}

    def applied(self, offsets: Mapping[int, int]) -> None:
        """`offsets`: partition -> next offset to read (last finished + 1)."""
        for partition, offset in offsets.items():
            if offset > self._pending.get(partition, -1):
                self._pending[partition] = offset

    def committable(self, partitions: Iterable[int] | None = None) -> dict[int, int]:
        """Applied but not yet committed offsets (of `partitions`, or of all)."""
        if partitions is None:
            return dict(self._pending)
        return {p: self._pending[p] for p in partitions if p in self._pending}

    def committed(self, offsets: Mapping[int, int]) -> None:
        """Kafka confirmed these; a later applied offset of the same partition stays."""
        for partition, offset in offsets.items():
            if self._pending.get(partition) == offset:
                del self._pending[partition]

    def forget(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            self._pending.pop(partition, None)
