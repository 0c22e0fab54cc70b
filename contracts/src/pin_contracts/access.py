"""UserAccessChanged: a user's full snapshot of active role assignments."""

from __future__ import annotations

from typing import ClassVar
from uuid import UUID

from pin_contracts.enums import (
    AccessChangeReason,
    AccessChangeReasonWire,
    ScopeType,
    ScopeTypeWire,
    UnknownEnumValue,
    parse_enum,
)
from pin_contracts.event import EventStruct
from pin_contracts.wire import AwareDatetime, VersionInt, WireStruct

__all__ = ["ActiveRoleAssignmentSnapshot", "UserAccessChangedKafkaEvent"]


class ActiveRoleAssignmentSnapshot(WireStruct, frozen=True, kw_only=True):
    """One active RoleAssignment of the user, with its role code resolved.

    Fields the spec marks optional may be absent on the wire and read as null.
    """

    assignment_id: UUID
    role_id: UUID
    role_code: str
    """The role's code, resolved by the producer so consumers need no role lookup."""
    scope_type: ScopeTypeWire
    """What the assignment is scoped to; the matching Scope*Id below names the target
    (none for Company scope)."""
    scope_organization_id: UUID | None = None
    scope_project_group_id: UUID | None = None
    scope_project_id: UUID | None = None
    expires_at: AwareDatetime | None = None
    """When the assignment lapses; null for one that does not expire."""

    @property
    def parsed_scope_type(self) -> ScopeType | UnknownEnumValue:
        return parse_enum(ScopeType, self.scope_type)


class UserAccessChangedKafkaEvent(EventStruct, frozen=True, kw_only=True):
    """Payload of pin.identity.access.v1; consumers dedup by (UserId, Version).

    ActiveAssignments is authoritative: it replaces whatever the consumer cached.
    """

    EVENT_TYPE: ClassVar[str] = "UserAccessChanged"
    CONTRACT_VERSION: ClassVar[int] = 1
    AGGREGATE_TYPE: ClassVar[str] = "User"
    AGGREGATE_ID_FIELD: ClassVar[str] = "user_id"

    user_id: UUID
    """The user whose access changed: the Kafka key and the AggregateId."""
    company_id: UUID | None = None
    change_reason: AccessChangeReasonWire
    # A tuple keeps the frozen Struct hashable; on the wire it is a JSON array all the same.
    active_assignments: tuple[ActiveRoleAssignmentSnapshot, ...]
    """Every active assignment of the user, not only the changed role's."""
    version: VersionInt
    """RoleDefinition.Version for a fan-out, max(RoleAssignment.Version) for a single grant
    or revoke: two scales, so the snapshot, not the Version, is what a consumer trusts."""

    @property
    def parsed_change_reason(self) -> AccessChangeReason | UnknownEnumValue:
        return parse_enum(AccessChangeReason, self.change_reason)
