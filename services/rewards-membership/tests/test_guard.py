"""Spec steps 3-4 without services: the version guard and the row transition."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from pin_contracts import AgentMembershipChanged, encode, envelope_for
from rewards_membership.rules.guard import MembershipRow, is_stale, new_row, transition
from rewards_membership.rules.validation import MembershipChange, validate

AGENT = uuid.uuid4()
COMPANY = uuid.uuid4()
T0 = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
def change(
    event: Callable[..., AgentMembershipChanged], raw: Callable[..., bytes]
) -> Callable[..., MembershipChange]:
    def build(version: int, status: str = "Active", **kwargs: object) -> MembershipChange:
        payload = event(AGENT, COMPANY, version, status, **kwargs)
        try:
            value = encode(envelope_for(payload))
        except Exception:
            value = raw(payload)
        result = validate(value)
        assert isinstance(result, MembershipChange)
        return result

    return build


def test_new_row_has_no_membership(change: Callable[..., MembershipChange]) -> None:
    row = new_row(AGENT, COMPANY)
    assert row.last_membership_version == 0
    assert not is_stale(None, change(1))
    assert not is_stale(row, change(1))


def test_active_clears_leave_fields_and_tracks_activity(
    change: Callable[..., MembershipChange],
) -> None:
    left = MembershipRow(
        agent_user_id=AGENT,
        company_id=COMPANY,
        membership_status="Left",
        leave_reason="SelfLeave",
        left_at=T0,
        effective_at=T0,
        first_activity_at=T0 - timedelta(days=10),
        last_activity_at=T0,
        last_membership_version=2,
        version=5,
    )
    joined = T0 + timedelta(days=1)
    row = transition(left, change(3, joined_at=joined))
    assert row.membership_status == "Active"
    assert (row.leave_reason, row.left_at, row.effective_at) == (None, None, None)
    assert row.first_activity_at == T0 - timedelta(days=10)  # ??= keeps the first
    assert row.last_activity_at == joined
    assert row.last_membership_version == 3
    assert row.version == 6


def test_active_never_moves_last_activity_back(change: Callable[..., MembershipChange]) -> None:
    row = transition(
        MembershipRow(agent_user_id=AGENT, company_id=COMPANY, last_activity_at=T0),
        change(1, joined_at=T0 - timedelta(days=3)),
    )
    assert row.last_activity_at == T0
    assert row.first_activity_at == T0 - timedelta(days=3)


def test_left_sets_reason_and_dates(change: Callable[..., MembershipChange]) -> None:
    left_at, effective_at = T0 + timedelta(days=2), T0 + timedelta(days=30)
    row = transition(
        transition(new_row(AGENT, COMPANY), change(1)),
        change(2, "Left", reason="ExcludedByAgency", left_at=left_at, effective_at=effective_at),
    )
    assert row.membership_status == "Left"
    assert row.leave_reason == "ExcludedByAgency"
    assert (row.left_at, row.effective_at) == (left_at, effective_at)
    assert row.last_activity_at == left_at
    assert row.version == 2


def test_left_with_unknown_reason_has_no_reason(change: Callable[..., MembershipChange]) -> None:
    row = transition(new_row(AGENT, COMPANY), change(1, "Left", reason="Retired", left_at=T0))
    assert row.membership_status == "Left"
    assert row.leave_reason is None


def test_unknown_status_is_stored_as_left(change: Callable[..., MembershipChange]) -> None:
    row = transition(new_row(AGENT, COMPANY), change(1, "Suspended"))
    assert row.membership_status == "Left"


@pytest.mark.parametrize("version", [1, 4, 5])
def test_version_at_or_below_the_row_is_stale(
    change: Callable[..., MembershipChange], version: int
) -> None:
    row = MembershipRow(agent_user_id=AGENT, company_id=COMPANY, last_membership_version=5)
    assert is_stale(row, change(version))
    assert not is_stale(row, change(6))


def test_transition_refuses_another_row(change: Callable[..., MembershipChange]) -> None:
    with pytest.raises(ValueError, match="own"):
        transition(new_row(AGENT, uuid.uuid4()), change(1))
