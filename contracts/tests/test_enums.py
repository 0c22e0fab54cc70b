"""Unknown enum values: readers see them, producers cannot emit them."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any, assert_never

import msgspec
import pytest

from pin_contracts import (
    AccessChangeReason,
    AgentMembershipChanged,
    AgentMembershipStatus,
    Envelope,
    InvalidEventError,
    LeaveReason,
    ScopeType,
    UnknownEnumValue,
    UnknownEnumValueError,
    UserAccessChangedKafkaEvent,
    decode_access_changed,
    decode_membership_changed,
    encode,
    envelope_for,
    parse_enum,
)
from pin_contracts.schemas import generate_schema


def with_payload(envelope: Envelope[Any], **payload_fields: Any) -> bytes:
    raw = json.loads(encode(envelope))
    raw["Payload"].update(payload_fields)
    return json.dumps(raw).encode()


def membership_is_active(payload: AgentMembershipChanged) -> bool:
    """How the rewards consumer is meant to read Status: exhaustively, failing closed."""
    status = payload.parsed_status
    if isinstance(status, UnknownEnumValue):
        return False
    if status is AgentMembershipStatus.ACTIVE:
        return True
    if status is AgentMembershipStatus.LEFT:
        return False
    assert_never(status)


def test_unknown_status_decodes_and_stays_visible(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    payload = decode_membership_changed(with_payload(membership_envelope, Status="Suspended"))

    assert payload.payload.status == "Suspended"
    assert payload.payload.parsed_status == UnknownEnumValue(AgentMembershipStatus, "Suspended")
    assert not membership_is_active(payload.payload)


def test_known_status_parses_to_its_member(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    payload = decode_membership_changed(with_payload(membership_envelope, Status="Active"))

    assert payload.payload.parsed_status is AgentMembershipStatus.ACTIVE
    assert membership_is_active(payload.payload)


def test_unknown_leave_reason_is_distinguishable_from_none(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    unknown = decode_membership_changed(with_payload(membership_envelope, Reason="Retired"))
    absent = decode_membership_changed(with_payload(membership_envelope, Reason=None))
    known = decode_membership_changed(with_payload(membership_envelope, Reason="SelfLeave"))

    assert isinstance(unknown.payload.parsed_reason, UnknownEnumValue)
    assert unknown.payload.parsed_reason.raw == "Retired"
    assert unknown.payload.parsed_reason.enum_type is LeaveReason
    assert str(unknown.payload.parsed_reason) == "Retired"
    assert absent.payload.parsed_reason is None
    assert known.payload.parsed_reason is LeaveReason.SELF_LEAVE


def test_unknown_change_reason_and_scope_type_decode(
    access_envelope: Envelope[UserAccessChangedKafkaEvent],
) -> None:
    raw = json.loads(encode(access_envelope))
    raw["Payload"]["ChangeReason"] = "TenantMerged"
    raw["Payload"]["ActiveAssignments"][0]["ScopeType"] = "Region"

    payload = decode_access_changed(json.dumps(raw).encode()).payload

    assert payload.parsed_change_reason == UnknownEnumValue(AccessChangeReason, "TenantMerged")
    assert payload.active_assignments[0].parsed_scope_type == UnknownEnumValue(ScopeType, "Region")
    assert payload.active_assignments[1].parsed_scope_type is ScopeType.PROJECT


def test_values_are_case_sensitive() -> None:
    assert parse_enum(AgentMembershipStatus, "active") == UnknownEnumValue(
        AgentMembershipStatus, "active"
    )
    assert parse_enum(AgentMembershipStatus, "") == UnknownEnumValue(AgentMembershipStatus, "")
    assert parse_enum(AgentMembershipStatus, "Left") is AgentMembershipStatus.LEFT


def test_an_unknown_value_of_one_enum_differs_from_another_enums() -> None:
    assert parse_enum(LeaveReason, "X") != parse_enum(AgentMembershipStatus, "X")


@pytest.mark.parametrize(
    ("field", "raw", "path", "enum_type", "known"),
    [
        ("status", "Suspended", "$.Payload.Status", AgentMembershipStatus, "Active, Left"),
        ("reason", "Retired", "$.Payload.Reason", LeaveReason, "SelfLeave, ExcludedByAgency"),
    ],
    ids=["status", "optional-reason"],
)
def test_encoding_an_unknown_value_raises_a_typed_error(  # noqa: PLR0917 - the table's columns
    membership_payload: AgentMembershipChanged,
    field: str,
    raw: str,
    path: str,
    enum_type: type[Enum],
    known: str,
) -> None:
    envelope = envelope_for(msgspec.structs.replace(membership_payload, **{field: raw}))

    with pytest.raises(UnknownEnumValueError) as caught:
        encode(envelope)

    assert isinstance(caught.value, InvalidEventError)
    assert caught.value.path == path
    assert caught.value.enum_type is enum_type
    assert caught.value.raw == raw
    assert known in str(caught.value)


def test_encoding_an_unknown_nested_scope_type_names_its_path(
    access_payload: UserAccessChangedKafkaEvent,
) -> None:
    assignments = list(access_payload.active_assignments)
    assignments[1] = msgspec.structs.replace(assignments[1], scope_type="Region")
    envelope = envelope_for(
        msgspec.structs.replace(access_payload, active_assignments=tuple(assignments))
    )

    with pytest.raises(UnknownEnumValueError) as caught:
        encode(envelope)

    assert caught.value.path == "$.Payload.ActiveAssignments[1].ScopeType"


@pytest.mark.parametrize("status", list(AgentMembershipStatus))
@pytest.mark.parametrize("reason", [*LeaveReason, None])
def test_every_known_value_encodes(
    membership_payload: AgentMembershipChanged,
    status: AgentMembershipStatus,
    reason: LeaveReason | None,
) -> None:
    payload = msgspec.structs.replace(membership_payload, status=status, reason=reason)

    decoded = decode_membership_changed(encode(envelope_for(payload))).payload

    assert (decoded.parsed_status, decoded.parsed_reason) == (status, reason)


def test_schema_lists_the_known_values() -> None:
    defs = generate_schema(AgentMembershipChanged)["$defs"]["AgentMembershipChanged"]
    access_defs = generate_schema(UserAccessChangedKafkaEvent)["$defs"]

    assert defs["properties"]["Status"]["enum"] == ["Active", "Left"]
    assert defs["properties"]["Reason"]["anyOf"][0]["enum"] == ["SelfLeave", "ExcludedByAgency"]
    assert access_defs["UserAccessChangedKafkaEvent"]["properties"]["ChangeReason"]["enum"] == [
        "RolePermissionsChanged",
        "RoleAssignmentGranted",
        "RoleAssignmentRevoked",
        "RoleAssignmentExpired",
    ]
    assert access_defs["ActiveRoleAssignmentSnapshot"]["properties"]["ScopeType"]["enum"] == [
        "Company",
        "Organization",
        "ProjectGroup",
        "Project",
    ]
