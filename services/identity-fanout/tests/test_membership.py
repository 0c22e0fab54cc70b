"""The membership producer's pure decisions: request checks, the next row, the event."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from identity_fanout.membership.decisions import (
    Membership,
    MembershipRequest,
    membership_event,
    membership_message,
    next_membership,
    parse_request,
)
from identity_fanout.membership.errors import (
    InvalidMembershipChangeError,
    MembershipAlreadyActiveError,
    MembershipNotActiveError,
)
from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    EMPTY_GUID,
    AgentMembershipStatus,
    LeaveReason,
    decode_membership_changed,
)

AGENT = uuid.UUID("a1b2c3d4-e5f6-4789-8abc-def012345678")
AGENCY = uuid.UUID("c0c0c0c0-0000-4000-8000-000000000001")
T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


def join_request(at: datetime = T0, invitation: uuid.UUID | None = None) -> MembershipRequest:
    return parse_request(
        agent_user_id=AGENT,
        company_id=AGENCY,
        status="Active",
        invitation_id=invitation,
        occurred_at=at,
    )


def leave_request(
    at: datetime, reason: str = "SelfLeave", effective_at: datetime | None = None
) -> MembershipRequest:
    return parse_request(
        agent_user_id=AGENT,
        company_id=AGENCY,
        status=AgentMembershipStatus.LEFT,
        reason=reason,
        effective_at=effective_at,
        occurred_at=at,
    )


def test_first_join_is_version_1_active_without_leave_data() -> None:
    invitation = uuid.uuid4()
    new_id = uuid.uuid4()
    joined = next_membership(None, join_request(invitation=invitation), new_id=new_id)
    assert joined == Membership(
        id=new_id,
        agent_user_id=AGENT,
        company_id=AGENCY,
        status=AgentMembershipStatus.ACTIVE,
        reason=None,
        effective_at=None,
        joined_at=T0,
        left_at=None,
        invitation_id=invitation,
        version=1,
    )


def test_leave_keeps_joined_at_and_defaults_effective_at_to_left_at() -> None:
    joined = next_membership(None, join_request(), new_id=uuid.uuid4())
    at = T0 + timedelta(days=30)
    left = next_membership(joined, leave_request(at, "ExcludedByAgency"), new_id=uuid.uuid4())
    assert left.id == joined.id
    assert left.status is AgentMembershipStatus.LEFT
    assert left.reason is LeaveReason.EXCLUDED_BY_AGENCY
    assert (left.joined_at, left.left_at, left.effective_at) == (T0, at, at)
    assert left.version == 2


def test_deferred_leave_keeps_its_effective_at() -> None:
    joined = next_membership(None, join_request(), new_id=uuid.uuid4())
    at = T0 + timedelta(days=30)
    later = at + timedelta(days=14)
    left = next_membership(joined, leave_request(at, effective_at=later), new_id=uuid.uuid4())
    assert (left.left_at, left.effective_at) == (at, later)


def test_rejoin_reactivates_the_same_row_with_the_next_version() -> None:
    joined = next_membership(None, join_request(), new_id=uuid.uuid4())
    left = next_membership(joined, leave_request(T0 + timedelta(days=1)), new_id=uuid.uuid4())
    again_at = T0 + timedelta(days=2)
    invitation = uuid.uuid4()
    rejoined = next_membership(
        left, join_request(again_at, invitation=invitation), new_id=uuid.uuid4()
    )
    assert rejoined.id == joined.id
    assert rejoined.version == 3
    assert rejoined.status is AgentMembershipStatus.ACTIVE
    assert (rejoined.reason, rejoined.effective_at, rejoined.left_at) == (None, None, None)
    assert (rejoined.joined_at, rejoined.invitation_id) == (again_at, invitation)


def test_join_while_active_is_refused() -> None:
    joined = next_membership(None, join_request(), new_id=uuid.uuid4())
    with pytest.raises(MembershipAlreadyActiveError, match="already Active"):
        next_membership(joined, join_request(T0 + timedelta(hours=1)), new_id=uuid.uuid4())


def test_leave_without_membership_or_twice_is_refused() -> None:
    with pytest.raises(MembershipNotActiveError, match="has never been a member"):
        next_membership(None, leave_request(T0), new_id=uuid.uuid4())
    joined = next_membership(None, join_request(), new_id=uuid.uuid4())
    left = next_membership(joined, leave_request(T0 + timedelta(days=1)), new_id=uuid.uuid4())
    with pytest.raises(MembershipNotActiveError, match="is Left"):
        next_membership(left, leave_request(T0 + timedelta(days=2)), new_id=uuid.uuid4())


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"agent_user_id": EMPTY_GUID}, "AgentUserId"),
        ({"company_id": EMPTY_GUID}, "CompanyId"),
        ({"status": "Suspended"}, "Status"),
        ({"status": "active"}, "Status"),
        ({"status": "Left", "reason": "Fired"}, "Reason"),
        ({"status": "Left"}, "Reason"),
        ({"status": "Active", "reason": "SelfLeave"}, "Reason"),
        ({"status": "Active", "effective_at": T0}, "Reason"),
        ({"status": "Left", "reason": "SelfLeave", "invitation_id": uuid.uuid4()}, "InvitationId"),
        ({"invitation_id": EMPTY_GUID}, "InvitationId"),
        ({"occurred_at": datetime(2025, 1, 1)}, "OccurredAt"),  # noqa: DTZ001 - naive on purpose
        (
            {"status": "Left", "reason": "SelfLeave", "effective_at": datetime(2025, 1, 1)},  # noqa: DTZ001
            "EffectiveAt",
        ),
    ],
)
def test_bad_requests_name_the_field(overrides: dict[str, object], field: str) -> None:
    arguments: dict[str, object] = {
        "agent_user_id": AGENT,
        "company_id": AGENCY,
        "status": "Active",
    } | overrides
    with pytest.raises(InvalidMembershipChangeError) as caught:
        parse_request(**arguments)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert str(caught.value).startswith(f"invalid membership change: {field}: ")


def test_unknown_reason_lists_the_known_values() -> None:
    with pytest.raises(InvalidMembershipChangeError, match="known: SelfLeave, ExcludedByAgency"):
        parse_request(agent_user_id=AGENT, company_id=AGENCY, status="Left", reason="Fired")


def test_event_carries_the_row_and_the_envelope_the_aggregate() -> None:
    joined = next_membership(None, join_request(), new_id=uuid.uuid4())
    at = T0 + timedelta(days=30)
    left = next_membership(joined, leave_request(at, "SelfLeave"), new_id=uuid.uuid4())
    payload = membership_event(left)
    assert payload.status == "Left"
    assert payload.reason == "SelfLeave"
    assert (payload.joined_at, payload.left_at, payload.effective_at) == (T0, at, at)

    envelope, message = membership_message(left, occurred_at=at, correlation_id="op-1")
    assert message.topic == AGENT_MEMBERSHIP_CHANGED.name
    assert message.key == str(AGENT)
    assert (envelope.aggregate_type, envelope.aggregate_id) == ("AgentMembership", str(left.id))
    assert envelope.version == left.version == 2
    decoded = decode_membership_changed(message.value)
    assert decoded == envelope
    assert dict(message.headers) == {
        "pin-event-type": "AgentMembershipChanged",
        "pin-contract-version": "1",
        "pin-message-id": str(envelope.message_id),
    }


def test_active_event_writes_reason_and_effective_at_as_explicit_nulls() -> None:
    joined = next_membership(None, join_request(), new_id=uuid.uuid4())
    _, message = membership_message(joined, occurred_at=T0, correlation_id=None)
    assert b'"Reason":null' in message.value
    assert b'"EffectiveAt":null' in message.value
    assert b'"LeftAt":null' in message.value
