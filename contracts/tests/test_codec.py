"""Round trips, exact wire names and producer-side refusals."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# jsonschema ships no type stubs, and the workspace's dev group (not ours) pins tools.
import jsonschema  # type: ignore[import-untyped]
import msgspec
import pytest

from pin_contracts import (
    EMPTY_GUID,
    AccessChangeReason,
    AgentMembershipChanged,
    AgentMembershipStatus,
    ContractError,
    Envelope,
    InvalidEventError,
    UserAccessChangedKafkaEvent,
    decode,
    decode_access_changed,
    decode_membership_changed,
    encode,
    envelope_for,
    is_empty_guid,
)
from pin_contracts.schemas import schema_file_name

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"

ENVELOPE_KEYS = [
    "MessageId",
    "EventType",
    "ContractVersion",
    "OccurredAt",
    "AggregateType",
    "AggregateId",
    "Version",
    "CorrelationId",
    "Payload",
]


def wire(envelope: Envelope[Any]) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(encode(envelope))
    return raw


def test_access_changed_round_trips(
    access_envelope: Envelope[UserAccessChangedKafkaEvent],
) -> None:
    decoded = decode_access_changed(encode(access_envelope))

    assert decoded == access_envelope
    assert decoded.payload.active_assignments[1].expires_at == (
        access_envelope.payload.active_assignments[1].expires_at
    )


def test_membership_changed_round_trips(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    assert decode_membership_changed(encode(membership_envelope)) == membership_envelope


def test_active_membership_round_trips_with_nulls(
    membership_payload: AgentMembershipChanged,
) -> None:
    active = msgspec.structs.replace(
        membership_payload,
        status=AgentMembershipStatus.ACTIVE,
        reason=None,
        effective_at=None,
        left_at=None,
        invitation_id=None,
    )
    envelope = envelope_for(active)

    raw = wire(envelope)

    assert decode(encode(envelope), AgentMembershipChanged) == envelope
    # Nulls are written, not omitted: readers see every v1 field.
    assert raw["Payload"]["Reason"] is None
    assert raw["Payload"]["InvitationId"] is None


def test_access_changed_wire_names_are_the_specs(
    access_envelope: Envelope[UserAccessChangedKafkaEvent],
) -> None:
    raw = wire(access_envelope)

    assert list(raw) == ENVELOPE_KEYS
    assert list(raw["Payload"]) == [
        "UserId",
        "CompanyId",
        "ChangeReason",
        "ActiveAssignments",
        "Version",
    ]
    assert list(raw["Payload"]["ActiveAssignments"][0]) == [
        "AssignmentId",
        "RoleId",
        "RoleCode",
        "ScopeType",
        "ScopeOrganizationId",
        "ScopeProjectGroupId",
        "ScopeProjectId",
        "ExpiresAt",
    ]


def test_membership_changed_wire_names_are_the_specs(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    raw = wire(membership_envelope)

    assert list(raw) == ENVELOPE_KEYS
    assert list(raw["Payload"]) == [
        "MembershipId",
        "AgentUserId",
        "CompanyId",
        "Status",
        "Reason",
        "EffectiveAt",
        "Version",
        "LeftAt",
        "JoinedAt",
        "InvitationId",
    ]


def test_wire_values_are_canonical(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    raw = wire(membership_envelope)

    assert raw["MessageId"] == str(membership_envelope.message_id)
    assert raw["EventType"] == "AgentMembershipChanged"
    assert raw["ContractVersion"] == 1
    assert raw["OccurredAt"] == "2025-03-01T12:30:15.123456Z"
    assert raw["AggregateType"] == "AgentMembership"
    assert raw["AggregateId"] == str(membership_envelope.payload.membership_id)
    assert raw["Version"] == raw["Payload"]["Version"] == 4
    assert raw["Payload"]["AgentUserId"] == "a1b2c3d4-e5f6-4789-8abc-def012345678"
    assert raw["Payload"]["Status"] == "Left"
    assert raw["Payload"]["Reason"] == "ExcludedByAgency"


def test_envelope_for_fills_the_metadata(access_payload: UserAccessChangedKafkaEvent) -> None:
    before = datetime.now(UTC)

    first = envelope_for(access_payload, correlation_id="job-run-1")
    second = envelope_for(access_payload)

    assert first.message_id != second.message_id
    assert first.message_id.version == 4
    assert before <= first.occurred_at <= datetime.now(UTC)
    assert first.occurred_at.tzinfo is UTC
    assert (first.event_type, first.contract_version) == ("UserAccessChanged", 1)
    assert (first.aggregate_type, first.aggregate_id) == ("User", str(access_payload.user_id))
    assert first.version == access_payload.version
    assert (first.correlation_id, second.correlation_id) == ("job-run-1", None)


def test_envelope_for_refuses_a_naive_timestamp(
    access_payload: UserAccessChangedKafkaEvent,
) -> None:
    naive = datetime(2025, 1, 1)  # noqa: DTZ001 - the point of the test

    with pytest.raises(InvalidEventError) as caught:
        envelope_for(access_payload, occurred_at=naive)

    assert caught.value.path == "$.OccurredAt"


def test_unknown_fields_from_a_newer_producer_are_ignored(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    raw = wire(membership_envelope)
    raw["TenantHint"] = {"nested": [1, 2, 3]}
    raw["Payload"]["DisplayName"] = "added in a later minor"

    decoded = decode_membership_changed(json.dumps(raw).encode())

    assert decoded == membership_envelope


def test_reason_and_effective_at_may_be_absent(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    # Producers from before ADR-0072 do not write the additive fields at all.
    raw = wire(membership_envelope)
    del raw["Payload"]["Reason"], raw["Payload"]["EffectiveAt"]

    payload = decode_membership_changed(json.dumps(raw).encode()).payload

    assert (payload.reason, payload.effective_at) == (None, None)


def test_optional_fields_of_the_spec_may_be_absent(
    membership_envelope: Envelope[AgentMembershipChanged],
    access_envelope: Envelope[UserAccessChangedKafkaEvent],
) -> None:
    # The specs mark these optional; a producer that leaves them out is not a contract
    # violation, and its event must not end in a DLQ.
    raw = wire(membership_envelope)
    del raw["Payload"]["InvitationId"], raw["Payload"]["LeftAt"]
    membership = decode_membership_changed(json.dumps(raw).encode()).payload
    assert (membership.invitation_id, membership.left_at) == (None, None)

    raw = wire(access_envelope)
    del raw["Payload"]["CompanyId"]
    for snapshot in raw["Payload"]["ActiveAssignments"]:
        for name in ("ScopeOrganizationId", "ScopeProjectGroupId", "ScopeProjectId", "ExpiresAt"):
            snapshot.pop(name, None)
    access = decode_access_changed(json.dumps(raw).encode()).payload
    assert access.company_id is None
    assert all(
        (s.scope_organization_id, s.scope_project_group_id, s.scope_project_id, s.expires_at)
        == (None, None, None, None)
        for s in access.active_assignments
    )


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"version": 0}, "$.Version"),
        ({"contract_version": 2}, "$.ContractVersion"),
        ({"event_type": "UserAccessChanged"}, "$.EventType"),
        ({"aggregate_type": "User"}, "$.AggregateType"),
        ({"version": 5}, "$.Version"),
        ({"occurred_at": datetime(2025, 1, 1)}, "$.OccurredAt"),  # noqa: DTZ001
        ({"message_id": "not-a-uuid"}, "$.MessageId"),
        ({"correlation_id": 42}, "$.CorrelationId"),
        ({"aggregate_id": object()}, "$"),
    ],
)
def test_encode_refuses_an_envelope_readers_would_reject(
    membership_envelope: Envelope[AgentMembershipChanged], change: dict[str, Any], path: str
) -> None:
    broken = msgspec.structs.replace(membership_envelope, **change)

    with pytest.raises(InvalidEventError) as caught:
        encode(broken)

    assert caught.value.path == path
    assert isinstance(caught.value, ContractError)


@pytest.mark.parametrize(
    ("change", "path"),
    [
        # The envelope mirrors the payload's Version, and is checked first.
        ({"version": 0}, "$.Version"),
        ({"version": 2**63}, "$.Version"),
        ({"joined_at": datetime(2024, 1, 1)}, "$.Payload.JoinedAt"),  # noqa: DTZ001
        ({"agent_user_id": "a1b2"}, "$.Payload.AgentUserId"),
    ],
)
def test_encode_refuses_a_payload_readers_would_reject(
    membership_payload: AgentMembershipChanged, change: dict[str, Any], path: str
) -> None:
    payload = msgspec.structs.replace(membership_payload, **change)
    envelope = msgspec.structs.replace(envelope_for(membership_payload), payload=payload)
    if "version" in change:
        envelope = msgspec.structs.replace(envelope, version=change["version"])

    with pytest.raises(InvalidEventError) as caught:
        encode(envelope)

    assert caught.value.path == path


@pytest.mark.parametrize("reason", list(AccessChangeReason))
def test_encoded_values_satisfy_the_committed_schema(
    access_payload: UserAccessChangedKafkaEvent,
    membership_envelope: Envelope[AgentMembershipChanged],
    reason: AccessChangeReason,
) -> None:
    access = envelope_for(msgspec.structs.replace(access_payload, change_reason=reason))
    for envelope, payload_type in (
        (access, UserAccessChangedKafkaEvent),
        (membership_envelope, AgentMembershipChanged),
    ):
        schema = json.loads((SCHEMA_DIR / schema_file_name(payload_type)).read_text())
        jsonschema.Draft202012Validator(
            schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        ).validate(wire(envelope))


def test_generic_decode_matches_the_typed_helpers(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    data = encode(membership_envelope)

    assert decode(data, AgentMembershipChanged) == decode_membership_changed(data)


def test_structs_are_frozen(membership_payload: AgentMembershipChanged) -> None:
    with pytest.raises(AttributeError):
        membership_payload.version = 9  # type: ignore[misc]
    assert hash(membership_payload) == hash(msgspec.structs.replace(membership_payload))


def test_guid_empty_decodes_and_is_recognisable(
    membership_payload: AgentMembershipChanged,
) -> None:
    empty = envelope_for(msgspec.structs.replace(membership_payload, company_id=uuid.UUID(int=0)))

    decoded = decode_membership_changed(encode(empty))

    assert decoded.payload.company_id == EMPTY_GUID
    assert is_empty_guid(decoded.payload.company_id)
    assert not is_empty_guid(decoded.payload.agent_user_id)
