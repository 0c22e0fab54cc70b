"""Sample events for tests, benchmarks and the demo: the one way they build a payload.

Every suite needs membership events with a few fields chosen and the rest plausible; this
builds them, so a field added to the contract is filled in one place.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Final

from pin_contracts import AgentMembershipChanged

__all__ = ["SAMPLE_JOINED_AT", "membership_event"]

SAMPLE_JOINED_AT: Final = datetime(2025, 1, 1, tzinfo=UTC)
"""JoinedAt of a sample event that does not choose one (fixed: runs are repeatable)."""


def membership_event(
    agent: uuid.UUID,
    company: uuid.UUID,
    version: int,
    status: str = "Active",
    *,
    reason: str | None = None,
    joined_at: datetime = SAMPLE_JOINED_AT,
    left_at: datetime | None = None,
    effective_at: datetime | None = None,
    membership_id: uuid.UUID | None = None,
    invitation_id: uuid.UUID | None = None,
) -> AgentMembershipChanged:
    """The `AgentMembershipChanged` payload of `agent` in `company` at `version`.

    `status` and `reason` are wire strings, so a test may send values the contract's enums
    do not know. `membership_id` defaults to one derived from the pair: every version of one
    membership carries the same id, as the producer's do."""
    return AgentMembershipChanged(
        membership_id=membership_id or uuid.uuid5(agent, str(company)),
        agent_user_id=agent,
        company_id=company,
        status=status,
        reason=reason,
        effective_at=effective_at,
        version=version,
        left_at=left_at,
        joined_at=joined_at,
        invitation_id=invitation_id,
    )
