"""A batch decided in memory: inbox, guard, per-key order; and the convergence property."""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from pin_contracts import AgentMembershipChanged, encode, envelope_for
from pin_testkit.events import membership_event
from rewards_membership.rules.guard import MembershipRow
from rewards_membership.rules.plan import Outcome, plan_batch
from rewards_membership.rules.validation import InvalidEvent, MembershipChange, validate

T0 = datetime(2025, 1, 1, tzinfo=UTC)
AGENTS = [uuid.UUID(int=i + 1) for i in range(3)]
COMPANIES = [uuid.UUID(int=100 + i) for i in range(2)]
STATUSES = ["Active", "Left"]
REASONS = [None, "SelfLeave", "ExcludedByAgency"]


def payload(
    agent: uuid.UUID, company: uuid.UUID, version: int, status: str, reason: str | None
) -> AgentMembershipChanged:
    left = status == "Left"
    return membership_event(
        agent,
        company,
        version,
        status,
        reason=reason if left else None,
        effective_at=T0 + timedelta(days=version, hours=1) if left else None,
        left_at=T0 + timedelta(days=version) if left else None,
        joined_at=T0 + timedelta(hours=version),
    )


def item(p: AgentMembershipChanged) -> MembershipChange:
    result = validate(encode(envelope_for(p)))
    assert isinstance(result, MembershipChange)
    return result


class MemoryStore:
    """What the database does with a plan: rows by key, inbox keys."""

    def __init__(self) -> None:
        self.rows: dict[tuple[uuid.UUID, uuid.UUID], MembershipRow] = {}
        self.inbox: set[str] = set()

    def apply(self, items: Sequence[MembershipChange | InvalidEvent]) -> list[Outcome]:
        keys = {i.key for i in items if isinstance(i, MembershipChange)}
        pairs = {i.row_key for i in items if isinstance(i, MembershipChange)}
        plan = plan_batch(
            items, keys & self.inbox, {k: r for k, r in self.rows.items() if k in pairs}
        )
        for row in plan.inserts:
            assert row.key not in self.rows
            self.rows[row.key] = row
        for row in plan.updates:
            assert row.last_membership_version > self.rows[row.key].last_membership_version
            self.rows[row.key] = row
        for key, _ in plan.inbox:
            assert key not in self.inbox
            self.inbox.add(key)
        return plan.outcomes


def test_batch_keeps_order_and_dedups_within_itself() -> None:
    agent, company = AGENTS[0], COMPANIES[0]
    joined = item(payload(agent, company, 1, "Active", None))
    left = item(payload(agent, company, 2, "Left", "SelfLeave"))
    store = MemoryStore()
    outcomes = store.apply([joined, left, joined, item(payload(agent, company, 2, "Active", None))])
    assert outcomes == [Outcome.APPLIED, Outcome.APPLIED, Outcome.DUPLICATE, Outcome.STALE]
    row = store.rows[(agent, company)]
    assert (row.membership_status, row.leave_reason, row.version) == ("Left", "SelfLeave", 2)
    assert len(store.inbox) == 3  # applied twice + stale once; the duplicate adds nothing


def test_invalid_items_are_dead_lettered_without_inbox_key() -> None:
    store = MemoryStore()
    broken = validate(b"{")
    assert isinstance(broken, InvalidEvent)
    assert store.apply([broken]) == [Outcome.DEAD_LETTERED]
    assert store.inbox == set()


def test_only_the_events_own_row_changes() -> None:
    store = MemoryStore()
    a, b = COMPANIES
    store.apply([item(payload(AGENTS[0], a, 1, "Active", None))])
    store.apply([item(payload(AGENTS[0], b, 1, "Active", None))])
    store.apply([item(payload(AGENTS[0], a, 2, "Left", "SelfLeave"))])
    assert store.rows[(AGENTS[0], a)].membership_status == "Left"
    assert store.rows[(AGENTS[0], b)].membership_status == "Active"
    assert store.rows[(AGENTS[0], b)].version == 1


events_strategy = st.lists(
    st.tuples(
        st.sampled_from(AGENTS),
        st.sampled_from(COMPANIES),
        st.sampled_from(STATUSES),
        st.sampled_from(REASONS),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(events=events_strategy, seed=st.integers(0, 2**32 - 1), duplicates=st.integers(0, 20))
def test_any_shuffle_with_duplicates_converges_to_the_highest_version(
    events: list[tuple[uuid.UUID, uuid.UUID, str, str | None]], seed: int, duplicates: int
) -> None:
    rng = random.Random(seed)
    versions: dict[tuple[uuid.UUID, uuid.UUID], int] = {}
    stream: list[MembershipChange] = []
    for agent, company, status, reason in events:
        version = versions.get((agent, company), 0) + rng.randint(1, 3)
        versions[(agent, company)] = version
        stream.append(item(payload(agent, company, version, status, reason)))
    latest = {}
    for change in stream:
        latest[change.row_key] = change  # versions grow per row in generation order
    delivered = stream + [rng.choice(stream) for _ in range(duplicates)]
    rng.shuffle(delivered)

    store = MemoryStore()
    position = 0
    while position < len(delivered):
        size = rng.randint(1, 8)
        store.apply(delivered[position : position + size])
        position += size

    assert set(store.rows) == set(latest)
    for key, change in latest.items():
        row = store.rows[key]
        expected_status = change.status.value
        assert row.membership_status == expected_status
        assert row.leave_reason == (
            None if change.leave_reason is None else change.leave_reason.value
        )
        assert row.left_at == (change.payload.left_at if expected_status == "Left" else None)
        assert row.effective_at == (
            change.payload.effective_at if expected_status == "Left" else None
        )
        assert row.last_membership_version == change.payload.version
    assert store.inbox == {c.key for c in stream}
