"""Another writer changes a row between a batch's read and its write.

The consumer's batch statement reads the batch's rows without locking them (its snapshot)
and updates each only if its version is still the one read (compare-and-set). A row
changed in between fails the batch, which is decided again on the fresh row: the guard
always ran against the row the update replaces, so nothing another writer did is lost. A
row or inbox key another instance inserted in between fails it likewise (unique
violation).

The race is made exact: the other session makes its change first without committing, so
the statement's snapshot still has the row as it was; it commits once the statement waits
for the row (or key) the change holds, after the statement read and decided.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from confluent_kafka import Message
from opentelemetry import trace
from psycopg.rows import TupleRow

from pin_contracts import AgentMembershipChanged, encode, envelope_for, kafka_key
from pin_runtime.postgres import SessionLimits
from rewards_membership.consumer.batch import Batch
from rewards_membership.consumer.database import BatchApplier
from rewards_membership.rules.plan import Outcome
from rewards_membership.store import MembershipStore

Row = dict[str, Any]


class RacingStore(MembershipStore):
    """A store whose first batch statement another session races with `interloper` (SQL),
    committed after the statement read the row and while it waits to write it."""

    def __init__(self, dsn: str, owner_dsn: str, interloper: str, params: dict[str, Any]) -> None:
        super().__init__(dsn, application_name="test-racing-store", session=SessionLimits())
        self._owner_dsn = owner_dsn
        self._interloper = interloper
        self._params = params
        self.reads = 0
        """Batch statements run: each reads the rows and inbox keys afresh."""

    def apply(  # type: ignore[override]  # the parent's is static; this one counts its calls
        self,
        conn: psycopg.Connection[TupleRow],
        document: bytes,
        lock_timeout_ms: int | None = None,
    ) -> list[Outcome]:
        self.reads += 1
        if self.reads > 1:
            return MembershipStore.apply(conn, document, lock_timeout_ms)
        with psycopg.connect(self._owner_dsn) as other:
            other.execute(self._interloper.encode(), self._params)  # holds the row, uncommitted
            committer = threading.Thread(
                target=_commit_once_waited_for, args=(other, self._owner_dsn, conn.info.backend_pid)
            )
            committer.start()
            try:
                return MembershipStore.apply(conn, document, lock_timeout_ms)
            finally:
                committer.join()


def _commit_once_waited_for(
    other: psycopg.Connection[TupleRow], owner_dsn: str, waiter: int
) -> None:
    """Commit `other` once the session `waiter` waits for a lock (what `other` holds)."""
    deadline = time.monotonic() + 10.0
    with psycopg.connect(owner_dsn, autocommit=True) as probe:
        while time.monotonic() < deadline:
            waiting = probe.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (waiter,)
            ).fetchone()
            if waiting is not None and waiting[0] > 0:
                break
            time.sleep(0.01)
    other.commit()


def _batch(payload: AgentMembershipChanged) -> Batch:
    """A batch of one record, as the consumer polls it."""
    envelope = envelope_for(payload)
    record = Message(
        topic="t", partition=0, offset=0, key=kafka_key(envelope), value=encode(envelope)
    )
    return Batch.of([record], poll_started=0, polled=0)


def _applied(store: MembershipStore, batch: Batch) -> list[Outcome | None]:
    BatchApplier(store, trace.get_tracer("test")).apply(batch, batch.records(), batch.document())
    return [record.outcome for record in batch.records()]


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
    seed = MembershipStore(consumer_dsn, application_name="test-seed", session=SessionLimits())
    racing = RacingStore(
        consumer_dsn, database, race.interloper, {"agent": agent, "company": company}
    )
    version, status, reason = race.change
    try:
        _applied(seed, _batch(event(agent, company, 1)))
        outcomes = _applied(racing, _batch(event(agent, company, version, status, reason=reason)))
    finally:
        seed.close()
        racing.close()
    assert (outcomes, racing.reads) == ([race.outcome], 2)
    (row,) = rows("agent_user_id = %(agent)s", {"agent": agent})
    assert (
        row["membership_status"],
        row["last_membership_version"],
        row["version"],
        row["deals_closed_count"],
    ) == race.row


@dataclass(frozen=True)
class Creation:
    interloper: str
    """What another session commits right after the batch read that there was none."""
    outcome: Outcome
    row: tuple[str, int, int] | None
    """The row afterwards: status, LastMembershipVersion, Version (None: no row)."""


CREATIONS = {
    # Another instance created the row (its first event, version 2) meanwhile: this batch
    # read no row, so its insert fails; decided again, its version 1 is stale.
    "row created meanwhile": Creation(
        "INSERT INTO rewards.agent_performance (agent_user_id, company_id,"
        " membership_status, last_membership_version, version)"
        " VALUES (%(agent)s, %(company)s, 'Left', 2, 1)",
        Outcome.STALE,
        ("Left", 2, 1),
    ),
    # Another instance recorded this very message meanwhile (and applied it elsewhere):
    # decided again, it is a duplicate and the row is not created.
    "inbox key recorded meanwhile": Creation(
        "INSERT INTO rewards.inbox (idempotency_key, outcome)"
        " VALUES (%(key)s, 'membership-applied')",
        Outcome.DUPLICATE,
        None,
    ),
}


@pytest.mark.parametrize("creation", CREATIONS.values(), ids=CREATIONS.keys())
def test_a_row_or_key_created_after_the_read_redecides_the_batch(
    creation: Creation,
    consumer_dsn: str,
    database: str,
    event: Callable[..., AgentMembershipChanged],
    rows: Callable[..., list[Row]],
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    batch = _batch(event(agent, company, 1))
    racing = RacingStore(
        consumer_dsn,
        database,
        creation.interloper,
        {"agent": agent, "company": company, "key": batch.records()[0].item.key},
    )
    try:
        outcomes = _applied(racing, batch)
    finally:
        racing.close()
    assert (outcomes, racing.reads) == ([creation.outcome], 2)
    found = [
        (r["membership_status"], r["last_membership_version"], r["version"])
        for r in rows("agent_user_id = %(agent)s", {"agent": agent})
    ]
    assert found == ([] if creation.row is None else [creation.row])
