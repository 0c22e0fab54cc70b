"""What a round of the relay does with each row, once Kafka has answered. Pure.

The rows of a round are walked in outbox id order:

- acknowledged by the broker: delete it;
- refused with a non-retriable error (`pin_runtime.delivery.classify`: too large, invalid
  record, invalid topic name): quarantine it — it would be refused again whatever the
  broker's health, and it must not hold up the rows behind it;
- refused with a retriable error (broker down, timeout, not leader, queue full) or by the
  cluster (not authorized, not authenticated, no such topic: `pause`), or without
  an outcome (still in flight when the wait ended, never produced): the round stops here.
  This row and every row after it stay in the outbox for the next round, acknowledged or
  not: a re-send may duplicate a record, but a later row of the same key never overtakes
  one that may yet be delivered, and nothing is lost.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import takewhile

from identity_fanout.outbox.records import OutboxRecord
from pin_runtime.delivery import DeliveryFailure

__all__ = ["Refusal", "Settlement", "settle"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A row to quarantine, and why."""

    record: OutboxRecord
    failure: DeliveryFailure


@dataclass(frozen=True, slots=True)
class Settlement:
    """The decision on one round's rows."""

    delete: tuple[int, ...]
    """Outbox ids the broker acknowledged, before the stop."""
    quarantine: tuple[Refusal, ...]
    """Rows refused for good, before the stop, in id order."""
    stopped_at: OutboxRecord | None = None
    """The first row that waits for another round (None: the whole round was settled)."""
    stop_failure: DeliveryFailure | None = None
    """Why it waits: its retriable (or cluster-wide) failure, or None when it has no outcome
    at all."""
    waiting: int = 0
    """Rows left in the outbox for the next round: `stopped_at` and all after it."""

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    def stop_reason(self) -> str | None:
        """One line for logs and readiness: what holds the round, on which row."""
        if self.stopped_at is None:
            return None
        detail = str(self.stop_failure) if self.stop_failure else "no acknowledgement"
        return f"{detail} (outbox id {self.stopped_at.id}, topic {self.stopped_at.topic})"


def settle(
    records: Sequence[OutboxRecord],
    acknowledged: Collection[int],
    failures: Mapping[int, DeliveryFailure],
    ids: Iterable[int] | None = None,
) -> Settlement:
    """Decide each row of a round from the tracker's outcome (keyed by outbox id).

    `ids`: the records' ids in the same order, if the caller keeps them (the in-flight
    window does): each run of acknowledged rows is then taken in one C-level pass
    (`takewhile` over the ids), which is all a healthy flow ever sees; only a row that is
    not acknowledged costs a look of its own.
    """
    delete: list[int] = []
    quarantine: list[Refusal] = []
    remaining = iter(ids if ids is not None else [r.id for r in records])
    acked = acknowledged.__contains__
    total = len(records)
    index = 0
    while True:
        run = list(takewhile(acked, remaining))  # also consumes the first row not in it
        delete.extend(run)
        index += len(run)
        if index >= total:
            return Settlement(delete=tuple(delete), quarantine=tuple(quarantine))
        record = records[index]
        failure = failures.get(record.id)
        if failure is not None and not failure.retriable:
            quarantine.append(Refusal(record, failure))
            index += 1
            continue
        return Settlement(
            delete=tuple(delete),
            quarantine=tuple(quarantine),
            stopped_at=record,
            stop_failure=failure,
            waiting=total - index,
        )
