"""Builders of valid events shared by the contract tests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from pin_contracts import (
    AccessChangeReason,
    ActiveRoleAssignmentSnapshot,
    AgentMembershipChanged,
    AgentMembershipStatus,
    Envelope,
    LeaveReason,
    ScopeType,
    UserAccessChangedKafkaEvent,
    envelope_for,
)

OCCURRED_AT = datetime(2025, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)


@pytest.fixture
def access_payload() -> UserAccessChangedKafkaEvent:
    return UserAccessChangedKafkaEvent(
        user_id=uuid.UUID("0f0e0d0c-0b0a-4908-8706-050403020100"),
        company_id=uuid.uuid4(),
        change_reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED,
        active_assignments=(
            ActiveRoleAssignmentSnapshot(
                assignment_id=uuid.uuid4(),
                role_id=uuid.uuid4(),
                role_code="company-admin",
                scope_type=ScopeType.COMPANY,
                scope_organization_id=None,
                scope_project_group_id=None,
                scope_project_id=None,
                expires_at=None,
            ),
            ActiveRoleAssignmentSnapshot(
                assignment_id=uuid.uuid4(),
                role_id=uuid.uuid4(),
                role_code="project-viewer",
                scope_type=ScopeType.PROJECT,
                scope_organization_id=uuid.uuid4(),
                scope_project_group_id=uuid.uuid4(),
                scope_project_id=uuid.uuid4(),
                expires_at=datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=3))),
            ),
        ),
        version=7,
    )


@pytest.fixture
def membership_payload() -> AgentMembershipChanged:
    return AgentMembershipChanged(
        membership_id=uuid.uuid4(),
        agent_user_id=uuid.UUID("a1b2c3d4-e5f6-4789-8abc-def012345678"),
        company_id=uuid.uuid4(),
        status=AgentMembershipStatus.LEFT,
        reason=LeaveReason.EXCLUDED_BY_AGENCY,
        effective_at=datetime(2025, 3, 31, tzinfo=UTC),
        version=4,
        left_at=datetime(2025, 3, 1, 12, 0, tzinfo=UTC),
        joined_at=datetime(2024, 6, 1, 9, 0, tzinfo=UTC),
        invitation_id=uuid.uuid4(),
    )


@pytest.fixture
def access_envelope(
    access_payload: UserAccessChangedKafkaEvent,
) -> Envelope[UserAccessChangedKafkaEvent]:
    return envelope_for(access_payload, correlation_id="job-run-42", occurred_at=OCCURRED_AT)


@pytest.fixture
def membership_envelope(
    membership_payload: AgentMembershipChanged,
) -> Envelope[AgentMembershipChanged]:
    return envelope_for(membership_payload, occurred_at=OCCURRED_AT)
