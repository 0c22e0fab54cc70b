"""A whole batch decided in memory: inbox, guard and transitions, in consume order.

Pure: given the inbox keys and rows the database already holds, it says what happens to
every message and which rows and inbox keys to write. It is the spec's executable
definition of a batch: the consumer makes the same decisions inside its one batch
statement (`sql/batch.sql`, so a batch costs one statement whatever its size), and
tests/test_batch_sql_integration.py proves on generated batches against PostgreSQL that
the statement decides exactly as `plan_batch` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from uuid import UUID

from rewards_membership.rules.guard import MembershipRow, is_stale, new_row, transition
from rewards_membership.rules.validation import InvalidEvent, MembershipChange

__all__ = ["BatchPlan", "Outcome", "plan_batch"]

RowKey = tuple[UUID, UUID]


class Outcome(StrEnum):
    """What happened to one message; the values are the spec's log event names."""

    APPLIED = "membership-applied"
    STALE = "skipped-stale-membership"
    DUPLICATE = "skipped-duplicate"
    DEAD_LETTERED = "dead-lettered"


@dataclass(slots=True)
class BatchPlan:
    outcomes: list[Outcome] = field(default_factory=list)
    """One per input item, in the same order."""
    inserts: list[MembershipRow] = field(default_factory=list)
    """Rows absent from the database, in their state after the batch."""
    updates: list[MembershipRow] = field(default_factory=list)
    """Existing rows the batch changed, in their state after the batch."""
    read_versions: list[int] = field(default_factory=list)
    """The `version` each of `updates` had when read, in the same order: a write applies
    only to a row that still has it (compare-and-set; the rows are not locked)."""
    inbox: list[tuple[str, Outcome]] = field(default_factory=list)
    """Idempotency keys to record now (applied and stale; never duplicates). Dead letters
    are marked only after the broker acknowledged their DLQ copy (`dead_letter_keys`)."""
    dead_letter_keys: dict[int, str] = field(default_factory=dict)
    """Position in the batch -> inbox key of each record to dead-letter (when it has one)."""


def inbox_keys(items: Iterable[MembershipChange | InvalidEvent]) -> list[str]:
    """Every key the batch looks up: valid records' and dead letters' (spec step 1 first)."""
    return [item.key for item in items if item.key is not None]


def plan_batch(
    items: Sequence[MembershipChange | InvalidEvent],
    seen_keys: set[str] | frozenset[str],
    rows: Mapping[RowKey, MembershipRow],
) -> BatchPlan:
    """Decide every message of a batch; `rows` are the existing rows of the batch's keys."""
    plan = BatchPlan()
    seen = set(seen_keys)
    current: dict[RowKey, MembershipRow] = dict(rows)
    changed: dict[RowKey, MembershipRow] = {}
    for position, item in enumerate(items):
        # Spec step 1 before step 2: a MessageId already processed (or dead-lettered) is a
        # duplicate whatever its content; validation is pure, so it may run earlier.
        key = item.key
        if key is not None and key in seen:
            plan.outcomes.append(Outcome.DUPLICATE)
            continue
        if key is not None:
            seen.add(key)
        if isinstance(item, InvalidEvent):
            plan.outcomes.append(Outcome.DEAD_LETTERED)
            if key is not None:
                plan.dead_letter_keys[position] = key
            continue
        row = current.get(item.row_key)
        if is_stale(row, item):
            outcome = Outcome.STALE
        else:
            updated = transition(row or new_row(*item.row_key), item)
            current[item.row_key] = changed[item.row_key] = updated
            outcome = Outcome.APPLIED
        plan.outcomes.append(outcome)
        plan.inbox.append((item.key, outcome))
    for row_key, row in changed.items():
        read = rows.get(row_key)
        if read is None:
            plan.inserts.append(row)
        else:
            plan.updates.append(row)
            plan.read_versions.append(read.version)
    return plan
