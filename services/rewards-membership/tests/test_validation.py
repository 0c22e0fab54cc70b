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
from rewards_membership.rules.validation import (
    KEY_MISSING,
    KEY_NOT_AGENT_USER_ID,
    KEY_NOT_UTF8,
    InvalidEvent,
    MembershipChange,
    readable_fields,
    validate,
)

AGENT = uuid.UUID("11111111-1111-1111-1111-111111111111")
COMPANY = uuid.UUID("22222222-2222-2222-2222-222222222222")
LETTERED = uuid.UUID("6f1c8a62-5f2f-4b8e-9d7e-1a2b3c4d5e6f")


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


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        (str(LETTERED).encode(), None),
        (None, KEY_MISSING),
        (b"", KEY_MISSING),
        (b"\xff\xfe", KEY_NOT_UTF8),
        (str(LETTERED).upper().encode(), KEY_NOT_AGENT_USER_ID),
        (str(COMPANY).encode(), KEY_NOT_AGENT_USER_ID),
        (b"{" + str(LETTERED).encode() + b"}", KEY_NOT_AGENT_USER_ID),
    ],
)
def test_a_key_other_than_the_agent_user_id_is_named_not_refused(
    event: Callable[..., AgentMembershipChanged], key: bytes | None, problem: str | None
) -> None:
    value = encode(envelope_for(event(LETTERED, COMPANY, 1)))
    result = validate(value, key)
    assert isinstance(result, MembershipChange)
    assert result.key_problem == problem
    assert change(value).key_problem is None  # not checked unless a key is given


def test_the_log_fields_of_hostile_bytes_are_read_without_an_error() -> None:
    deep = b'{"MessageId":"' + str(AGENT).encode() + b'","X":' + b"[" * 100_000
    assert readable_fields(b"[" * 1_000 + b"]" * 1_000) == (None, {})
    assert readable_fields(deep) == (None, {})
    assert invalid(deep).reason == "JSON nested too deeply"
    odd = (
        b'{"MessageId":"' + str(AGENT).encode() + b'","CorrelationId":1e400,'
        b'"Payload":{"AgentUserId":"\xff","Version":' + b"9" * 400 + b',"Status":"Left",'
        b'"Status":"Active","Reason":[[["x"]]]}}'
    )
    assert readable_fields(odd) == (AGENT, {"Status": "Active"})
