"""Taking a unit of work from the queue, handing it back, and recording a failed batch.

A unit is a task walked as one unit or one shard of a large task; both follow the same
rules (claim with SKIP LOCKED, poison after MaxAttempts, fenced hand-back, shortened lease
after a failure), so `sql/units.sql` writes each statement once, composed here for the two
tables, and a held claim (`Claim`) hands back or records a failure the same way for both.
Pure decisions (`is_poisoned`, `retry_delay`) sit next to them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final, LiteralString, NamedTuple
from uuid import UUID

from psycopg import Connection, sql
from psycopg.rows import TupleRow, class_row, kwargs_row

from identity_fanout.fanout.shards import ClaimedShard, FanOutShard
from identity_fanout.fanout.tasks import FanOutTask, LeasedRow
from pin_contracts import FanOutTaskStatus
from pin_runtime.sql import columns, load_queries

_units = load_queries("identity_fanout", "fanout/sql/units.sql")
_shards = load_queries("identity_fanout", "fanout/sql/shards.sql")


class UnitStatements(NamedTuple):
    """The statements of `sql/units.sql` for one table (tasks or shards)."""

    claim: LiteralString
    lock_cursor: LiteralString
    checkpoint: LiteralString
    record_failure: LiteralString
    touch: LiteralString
    release: LiteralString


def _statements(table: str, candidate: LiteralString, returning: sql.Composable) -> UnitStatements:
    unit = sql.Identifier("identity", table)
    return UnitStatements(
        claim=_units.compose("claim", unit=unit, candidate=sql.SQL(candidate), returning=returning),
        lock_cursor=_units.compose("lock_cursor", unit=unit),
        checkpoint=_units.compose("checkpoint", unit=unit),
        record_failure=_units.compose("record_failure", unit=unit),
        touch=_units.compose("touch", unit=unit),
        release=_units.compose("release", unit=unit),
    )


TASK: Final = _statements(
    "access_fanout_tasks", _units.task_candidate, columns(FanOutTask, prefix="u")
)
SHARD: Final = _statements(
    "access_fanout_shards",
    _units.shard_candidate,
    sql.SQL(", ").join(
        [columns(FanOutShard, prefix="u"), sql.SQL("p.role_id, p.company_id, p.role_version")]
    ),
)


def claim_task(
    conn: Connection[TupleRow], *, lease: timedelta, max_attempts: int
) -> FanOutTask | None:
    """Claim the oldest available task (spec step 2), or None when the queue is empty.

    The returned task is InProgress with this claim's attempt_count, or Failed: a task that
    had max_attempts claims already is marked poison instead of claimed, and returned so the
    caller logs and counts it.
    """
    with conn.transaction(), conn.cursor(row_factory=class_row(FanOutTask)) as cur:
        cur.execute(TASK.claim, {"lease": lease, "max_attempts": max_attempts})
        return cur.fetchone()


def _claimed_shard(
    *, role_id: UUID, company_id: UUID | None, role_version: int, **shard: Any
) -> ClaimedShard:
    return ClaimedShard(
        shard=FanOutShard(**shard),
        role_id=role_id,
        company_id=company_id,
        role_version=role_version,
    )


def claim_shard(
    conn: Connection[TupleRow], *, lease: timedelta, max_attempts: int, fair: bool = True
) -> ClaimedShard | None:
    """Claim the next available shard, or None. A Failed one is poison: its task failed.

    ``fair``: None while a whole task has waited longer than every sharded task's turn
    (`sql/units.sql` shard_candidate): the caller claims that task first.
    """
    params = {"lease": lease, "max_attempts": max_attempts, "fair": fair}
    with conn.transaction():
        with conn.cursor(row_factory=kwargs_row(_claimed_shard)) as cur:
            claimed = cur.execute(SHARD.claim, params).fetchone()
        if claimed is not None and is_poisoned(claimed.shard):
            shard = claimed.shard
            conn.execute(
                _shards.fail_task,
                {"id": shard.task_id, "error": f"shard {shard.shard_no}: {shard.last_error}"},
            )
    return claimed


def is_poisoned(unit: LeasedRow) -> bool:
    return unit.status == FanOutTaskStatus.FAILED


class Claim(NamedTuple):
    """The claim a worker holds on a unit: the fencing token its hand-back and its failure
    record match on (`attempt_count`, status InProgress), for the unit's table."""

    statements: UnitStatements
    id: UUID
    attempt: int

    def release(self, conn: Connection[TupleRow]) -> bool:
        """Hand the unit back (graceful stop); False if the claim was no longer ours."""
        params = {"id": self.id, "attempt": self.attempt}
        with conn.transaction():
            return conn.execute(self.statements.release, params).rowcount == 1

    def record_failure(
        self, conn: Connection[TupleRow], error: str, retry_in: timedelta, *, counted: bool
    ) -> bool:
        """Keep why the batch failed and shorten the lease; an uncounted failure (not the
        unit's own) gives the attempt back. False if the claim was lost."""
        fence = {"id": self.id, "attempt": self.attempt}
        failure = {"error": error[:2000], "retry_in": retry_in, "counted": counted}
        with conn.transaction():
            cur = conn.execute(self.statements.record_failure, fence | failure)
            return cur.rowcount == 1

    def touch(self, conn: Connection[TupleRow], lease: timedelta) -> bool:
        """Extend the lease while waiting between batches; False if the claim was lost."""
        params = {"id": self.id, "attempt": self.attempt, "lease": lease}
        with conn.transaction():
            return conn.execute(self.statements.touch, params).rowcount == 1


def task_claim(task: FanOutTask) -> Claim:
    return Claim(TASK, task.id, task.attempt_count)


def shard_claim(shard: FanOutShard) -> Claim:
    return Claim(SHARD, shard.id, shard.attempt_count)


def retry_delay(attempt: int, *, polling_interval: timedelta, lease: timedelta) -> timedelta:
    """How soon a unit whose batch failed may be claimed again: doubling from the polling
    interval with each attempt, never longer than the lease it would have waited anyway."""
    exponent = max(0, min(attempt - 1, 30))
    delay: timedelta = polling_interval * (2**exponent)
    return min(lease, delay)
