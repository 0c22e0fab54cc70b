"""Spec steps 1-2 without services: what is valid, what goes to the DLQ and why."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import msgspec
import pytest

from pin_contracts import (
    EMPTY_GUID,
    REWARDS_MEMBERSHIP_EVENT_INVALID,
    AgentMembershipChanged,
    AgentMembershipStatus,
    LeaveReason,
    encode,
    envelope_for,
)
from rewards_membership.rules.validation import InvalidEvent, MembershipChange, validate

AGENT = uuid.UUID("11111111-1111-1111-1111-111111111111")
COMPANY = uuid.UUID("22222222-2222-2222-2222-222222222222")


def change(value: bytes) -> MembershipChange:
    result = validate(value)
    assert isinstance(result, MembershipChange), result
    return result


def invalid(value: bytes | None) -> InvalidEvent:
    result = validate(value)
    assert isinstance(result, InvalidEvent), result
    assert result.error_code == REWARDS_MEMBERSHIP_EVENT_INVALID
    assert result.exception_fqcn == "pin_contracts.errors.ContractViolation"
    return result


def test_active_maps_to_active_without_leave_fields(
    event: Callable[..., AgentMembershipChanged],
) -> None:
    envelope = envelope_for(event(AGENT, COMPANY, 3))
    result = change(encode(envelope))
    assert result.status is AgentMembershipStatus.ACTIVE
    assert result.leave_reason is None
    assert result.key == f"rewards:identity-membership:{envelope.message_id}"
    assert result.row_key == (AGENT, COMPANY)
    assert not result.unknown_status
    assert not result.unknown_reason
    assert not result.contract_mismatch


@pytest.mark.parametrize("reason", list(LeaveReason))
def test_left_keeps_its_known_reason(
    event: Callable[..., AgentMembershipChanged], reason: LeaveReason
) -> None:
    result = change(encode(envelope_for(event(AGENT, COMPANY, 2, "Left", reason=reason))))
    assert result.status is AgentMembershipStatus.LEFT
    assert result.leave_reason is reason


def test_unknown_status_fails_closed_as_left(
    event: Callable[..., AgentMembershipChanged], raw: Callable[..., bytes]
) -> None:
    result = change(raw(event(AGENT, COMPANY, 2, "Suspended")))
    assert result.status is AgentMembershipStatus.LEFT
    assert result.unknown_status
    assert result.payload.status == "Suspended"


def test_unknown_reason_degrades_to_left_without_reason(
    event: Callable[..., AgentMembershipChanged], raw: Callable[..., bytes]
) -> None:
    result = change(raw(event(AGENT, COMPANY, 2, "Left", reason="Retired")))
    assert result.status is AgentMembershipStatus.LEFT
    assert result.leave_reason is None
    assert result.unknown_reason


def test_unknown_reason_on_active_is_ignored(
    event: Callable[..., AgentMembershipChanged], raw: Callable[..., bytes]
) -> None:
    result = change(raw(event(AGENT, COMPANY, 2, "Active", reason="Retired")))
    assert not result.unknown_reason


def test_contract_version_mismatch_proceeds(
    event: Callable[..., AgentMembershipChanged], raw: Callable[..., bytes]
) -> None:
    result = change(raw(event(AGENT, COMPANY, 2), ContractVersion=2))
    assert result.contract_mismatch
    assert result.contract_version == 2


@pytest.mark.parametrize(
    ("agent", "company", "path"),
    [
        (EMPTY_GUID, COMPANY, "$.Payload.AgentUserId"),
        (AGENT, EMPTY_GUID, "$.Payload.CompanyId"),
    ],
)
def test_empty_guid_is_invalid(
    event: Callable[..., AgentMembershipChanged],
    agent: uuid.UUID,
    company: uuid.UUID,
    path: str,
) -> None:
    envelope = envelope_for(event(agent, company, 1, membership_id=uuid.uuid4()))
    result = invalid(encode(envelope))
    assert result.path == path
    assert result.message_id == envelope.message_id
    assert result.fields["Version"] == 1


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"\xff\xfe not utf-8",
        b"{not json",
        b"[]",
        b'{"MessageId": 5}',
    ],
)
def test_undecodable_bytes_are_invalid(value: bytes | None) -> None:
    invalid(value)


def test_wrong_json_type_names_the_field(event: Callable[..., AgentMembershipChanged]) -> None:
    data = msgspec.json.decode(encode(envelope_for(event(AGENT, COMPANY, 1))))
    data["Payload"]["Version"] = "seven"
    result = invalid(msgspec.json.encode(data))
    assert result.path == "$.Payload.Version"
