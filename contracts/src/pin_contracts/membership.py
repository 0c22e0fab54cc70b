"""AgentMembershipChanged: an agent joined (Active) or left (Left) an agency."""

from __future__ import annotations

from typing import ClassVar
from uuid import UUID

from pin_contracts.enums import (
    AgentMembershipStatus,
    AgentMembershipStatusWire,
    LeaveReason,
    LeaveReasonWire,
    UnknownEnumValue,
    parse_enum,
)
from pin_contracts.event import EventStruct
from pin_contracts.wire import AwareDatetime, VersionInt

__all__ = ["AgentMembershipChanged"]


class AgentMembershipChanged(EventStruct, frozen=True, kw_only=True):
    """Payload of pin.identity.agent-membership-changed.v1 (key AgentUserId).

    CompanyId is the agency. Guid.Empty decodes; consumers decide (see is_empty_guid).
    """

    EVENT_TYPE: ClassVar[str] = "AgentMembershipChanged"
    CONTRACT_VERSION: ClassVar[int] = 1
    AGGREGATE_TYPE: ClassVar[str] = "AgentMembership"
    AGGREGATE_ID_FIELD: ClassVar[str] = "membership_id"
    # Keyed by the agent, not the membership: per-agent order keeps the causal sequence of
    # joins and leaves across all the agent's agencies (ADR-0056).
    KEY_FIELD: ClassVar[str] = "agent_user_id"

    membership_id: UUID
    """The AggregateId: for tracing, never written to a projection."""
    agent_user_id: UUID
    """The agent: the Kafka key."""
    company_id: UUID
    """The agency the agent joined or left."""
    status: AgentMembershipStatusWire
    # Reason and EffectiveAt were added without a ContractVersion bump (ADR-0072), so older
    # producers omit them: they need defaults. Both are null when Status is Active.
    reason: LeaveReasonWire | None = None
    effective_at: AwareDatetime | None = None
    """When a leave takes effect; differs from LeftAt for a deferred dismissal."""
    version: VersionInt
    """The membership's version: a consumer applies only a Version above the last one."""
    left_at: AwareDatetime | None = None
    joined_at: AwareDatetime
    invitation_id: UUID | None = None
    """The invitation the agent joined by, if any (the rewards consumer does not read it)."""

    @property
    def parsed_status(self) -> AgentMembershipStatus | UnknownEnumValue:
        return parse_enum(AgentMembershipStatus, self.status)

    @property
    def parsed_reason(self) -> LeaveReason | UnknownEnumValue | None:
        return None if self.reason is None else parse_enum(LeaveReason, self.reason)
