"""A batch between poll and commit, and the pure decisions about which records stay ours.

The loop keeps at most one batch in flight (its transaction running on the database thread)
and one prefetched batch (polled and decoded meanwhile, not yet handed to the database thread). What
the prefetched batch may keep depends on what happened while it waited: records of a
partition that was revoked or lost, or paused by the failure of the batch before it, are
dropped, never applied or committed by this instance.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from confluent_kafka import Message
from opentelemetry.trace import Span

from rewards_membership.consumer.records import offset_of, partition_of
from rewards_membership.dlq.writer import Position, Receipt
from rewards_membership.rules.plan import BatchPlan, Outcome
from rewards_membership.rules.validation import Item

__all__ = [
    "Finished",
    "InFlight",
    "bounds",
    "finished_records",
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
    started: float
    receive: Span
    process: Span
    plan: Future[BatchPlan]


@dataclass(slots=True, kw_only=True)
class Finished:
    """A committed batch whose metrics, logs and spans are written after the next one
    started (they are not on the path from poll to commit)."""

    done: list[tuple[Message, Item, Outcome]]
    receipts: dict[Position, Receipt] = field(default_factory=dict)
    elapsed_ms: float
    receive: Span


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


def finished_records(
    records: Sequence[Message],
    items: Sequence[Item],
    outcomes: Sequence[Outcome],
    done: Mapping[int, int],
    receipts: Mapping[Position, Receipt],
) -> list[tuple[Message, Item, Outcome]]:
    """The committed records with the outcomes to report."""
    if not receipts and all(p in done for p in {m.partition() for m in records}):
        return list(zip(records, items, outcomes, strict=True))  # the usual whole batch
    finished = []
    for m, item, outcome in zip(records, items, outcomes, strict=True):
        if partition_of(m) not in done:
            continue
        # A duplicate we dead-lettered ourselves in an earlier try of this batch (marked,
        # then the batch failed): it is the dead letter it was.
        at = (partition_of(m), offset_of(m))
        reported = Outcome.DEAD_LETTERED if at in receipts else outcome
        finished.append((m, item, reported))
    return finished
