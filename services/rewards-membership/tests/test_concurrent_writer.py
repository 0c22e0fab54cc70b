"""Another writer changes a row between a batch's read and its write.

The consumer reads the batch's rows without locking them and updates each only if its
version is still the one read (compare-and-set). A row changed in between fails the
batch, which is decided again on the fresh row: the guard always ran against the row the
update replaces, so nothing another writer did is lost.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from opentelemetry import trace
from psycopg.rows import TupleRow

from pin_contracts import AgentMembershipChanged, encode, envelope_for
from pin_runtime.postgres import SessionLimits
from rewards_membership.applier import BatchApplier
from rewards_membership.guard import MembershipRow
from rewards_membership.plan import Outcome, RowKey
from rewards_membership.store import MembershipStore
from rewards_membership.validation import MembershipChange, validate

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


def _apply(
    consumer_dsn: str,
    database: str,
    interloper: str,
    params: dict[str, Any],
    *payloads: AgentMembershipChanged,
) -> tuple[list[Outcome], int]:
    store = RacingStore(consumer_dsn, database, interloper, params)
    try:
        plan = BatchApplier(store, trace.get_tracer("test")).apply([_change(p) for p in payloads])
    finally:
        store.close()
    return plan.outcomes, store.reads


def _seed(
    consumer_dsn: str,
    event: Callable[..., AgentMembershipChanged],
    agent: uuid.UUID,
    company: uuid.UUID,
) -> None:
    """The pair's row as its first event (version 1) left it."""
    store = MembershipStore(consumer_dsn, application_name="test-seed", session=SessionLimits())
    try:
        BatchApplier(store, trace.get_tracer("test")).apply([_change(event(agent, company, 1))])
    finally:
        store.close()


def test_a_newer_change_committed_meanwhile_makes_the_batch_stale(
    consumer_dsn: str,
    database: str,
    event: Callable[..., AgentMembershipChanged],
    rows: Callable[..., list[Row]],
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    _seed(consumer_dsn, event, agent, company)
    # Another instance applies version 5 (Left) after this batch read the row at version 1.
    interloper = (
        "UPDATE rewards.agent_performance SET membership_status = 'Left',"
        " last_membership_version = 5, version = version + 1"
        " WHERE agent_user_id = %(agent)s AND company_id = %(company)s"
    )
    outcomes, reads = _apply(
        consumer_dsn,
        database,
        interloper,
        {"agent": agent, "company": company},
        event(agent, company, 3),
    )
    # Decided again on the fresh row: version 3 is older than 5, so it is stale; an update
    # guarded only by what was read would have put the row back to Active at version 3.
    assert (outcomes, reads) == ([Outcome.STALE], 2)
    (row,) = rows("agent_user_id = %(agent)s", {"agent": agent})
    assert (row["membership_status"], row["last_membership_version"], row["version"]) == (
        "Left",
        5,
        2,
    )


def test_a_version_bump_by_another_writer_is_kept(
    consumer_dsn: str,
    database: str,
    event: Callable[..., AgentMembershipChanged],
    rows: Callable[..., list[Row]],
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    _seed(consumer_dsn, event, agent, company)
    # A writer of the row's other columns (earned metrics) bumps its version meanwhile.
    interloper = (
        "UPDATE rewards.agent_performance SET version = version + 1, deals_closed_count = 7"
        " WHERE agent_user_id = %(agent)s AND company_id = %(company)s"
    )
    outcomes, reads = _apply(
        consumer_dsn,
        database,
        interloper,
        {"agent": agent, "company": company},
        event(agent, company, 2, "Left", reason="SelfLeave"),
    )
    assert (outcomes, reads) == ([Outcome.APPLIED], 2)
    (row,) = rows("agent_user_id = %(agent)s", {"agent": agent})
    # Both changes count: version 1 -> 2 (the other writer) -> 3 (this change).
    assert (row["membership_status"], row["last_membership_version"], row["version"]) == (
        "Left",
        2,
        3,
    )
    assert row["deals_closed_count"] == 7
