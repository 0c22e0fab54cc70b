"""Another writer changes a row between a batch's read and its write.

The consumer reads the batch's rows without locking them and updates each only if its
version is still the one read (compare-and-set). A row changed in between fails the
batch, which is decided again on the fresh row: the guard always ran against the row the
update replaces, so nothing another writer did is lost.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from psycopg.rows import TupleRow

from pin_contracts import AgentMembershipChanged, encode, envelope_for
from pin_runtime.postgres import SessionLimits
from rewards_membership.consumer.database import BatchApplier
from rewards_membership.rules.guard import MembershipRow
from rewards_membership.rules.plan import Outcome, RowKey
from rewards_membership.rules.validation import MembershipChange, validate
from rewards_membership.store import MembershipStore

Row = dict[str, Any]


class RacingStore(MembershipStore):
    """A store after whose first read another session commits `interloper` (SQL)."""

    def __init__(self, dsn: str, owner_dsn: str, interloper: str, params: dict[str, Any]) -> None:
        super().__init__(dsn, application_name="test-racing-store", session=SessionLimits())
        self._owner_dsn = owner_dsn
        self._interloper = interloper
        self._params = params
        self.reads = 0

    def read(  # type: ignore[override]  # the parent's is static; this one counts its calls
        self,
        conn: psycopg.Connection[TupleRow],
        keys: Sequence[str],
        row_keys: Sequence[RowKey],
    ) -> tuple[set[str], dict[RowKey, MembershipRow]]:
        result = MembershipStore.read(conn, keys, row_keys)
        self.reads += 1
        if self.reads == 1:
            # Committed at once: the batch's transaction holds no lock on the row.
            with psycopg.connect(self._owner_dsn, autocommit=True) as other:
                other.execute(self._interloper.encode(), self._params)
        return result


def _change(payload: AgentMembershipChanged) -> MembershipChange:
    item = validate(encode(envelope_for(payload)))
    assert isinstance(item, MembershipChange)
    return item


@dataclass(frozen=True)
class Race:
    interloper: str
    """What another session commits right after the batch read the row (at version 1)."""
    change: tuple[Any, ...]
    """The batch's one event: (version, status, reason)."""
    outcome: Outcome
    row: tuple[str, int, int, int]
    """The row afterwards: status, LastMembershipVersion, Version, deals_closed_count."""


_WHERE = " WHERE agent_user_id = %(agent)s AND company_id = %(company)s"

RACES = {
    # Another instance applied version 5 (Left). Decided again on the fresh row, version 3
    # is stale; an update guarded only by what was read would put the row back to Active.
    "newer change committed meanwhile": Race(
        "UPDATE rewards.agent_performance SET membership_status = 'Left',"
        " last_membership_version = 5, version = version + 1" + _WHERE,
        (3, "Active", None),
        Outcome.STALE,
        ("Left", 5, 2, 0),
    ),
    # A writer of the row's other columns (earned metrics) bumped its version: both changes
    # count, version 1 -> 2 (the other writer) -> 3 (this change), its column kept.
    "other columns changed meanwhile": Race(
        "UPDATE rewards.agent_performance SET version = version + 1, deals_closed_count = 7"
        + _WHERE,
        (2, "Left", "SelfLeave"),
        Outcome.APPLIED,
        ("Left", 2, 3, 7),
    ),
}


@pytest.mark.parametrize("race", RACES.values(), ids=RACES.keys())
def test_a_row_changed_after_the_read_redecides_the_batch(
    race: Race,
    consumer_dsn: str,
    database: str,
    event: Callable[..., AgentMembershipChanged],
    rows: Callable[..., list[Row]],
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    tracer = trace.get_tracer("test")
    seed = MembershipStore(consumer_dsn, application_name="test-seed", session=SessionLimits())
    racing = RacingStore(
        consumer_dsn, database, race.interloper, {"agent": agent, "company": company}
    )
    version, status, reason = race.change
    try:
        BatchApplier(seed, tracer).apply([_change(event(agent, company, 1))])
        plan = BatchApplier(racing, tracer).apply(
            [_change(event(agent, company, version, status, reason=reason))]
        )
    finally:
        seed.close()
        racing.close()
    assert (plan.outcomes, racing.reads) == ([race.outcome], 2)
    (row,) = rows("agent_user_id = %(agent)s", {"agent": agent})
    assert (
        row["membership_status"],
        row["last_membership_version"],
        row["version"],
        row["deals_closed_count"],
    ) == race.row
