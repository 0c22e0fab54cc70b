"""Property tests: no input makes a decoder raise anything but ContractViolation."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pin_contracts import (
    ActiveRoleAssignmentSnapshot,
    AgentMembershipChanged,
    AgentMembershipStatus,
    ContractViolation,
    Envelope,
    LeaveReason,
    ScopeType,
    UserAccessChangedKafkaEvent,
    decode_access_changed,
    decode_membership_changed,
    encode,
    envelope_for,
)
from pin_contracts.enums import AccessChangeReason
from pin_contracts.wire import INT64_MAX

# No deadline: the first example pays for compiling msgspec decoders.
fuzz = settings(max_examples=200, deadline=None)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded on purpose: huge numbers must not escape as OverflowError
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=25,
)
envelope_like = st.fixed_dictionaries(
    {},
    optional={
        key: json_values | st.uuids().map(str) | st.datetimes(timezones=st.just(UTC)).map(str)
        for key in Envelope.__struct_encode_fields__  # the wire names
    },
)

aware_datetimes = st.datetimes(
    min_value=datetime(1, 1, 2),  # noqa: DTZ001 - bounds of a naive strategy
    max_value=datetime(9999, 12, 30),  # noqa: DTZ001
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=3)), timezone(timedelta(hours=-5))]),
)
versions = st.integers(min_value=1, max_value=INT64_MAX)

memberships = st.builds(
    AgentMembershipChanged,
    membership_id=st.uuids(),
    agent_user_id=st.uuids(),
    company_id=st.uuids(),
    status=st.sampled_from(list(AgentMembershipStatus)),
    reason=st.none() | st.sampled_from(list(LeaveReason)),
    effective_at=st.none() | aware_datetimes,
    version=versions,
    left_at=st.none() | aware_datetimes,
    joined_at=aware_datetimes,
    invitation_id=st.none() | st.uuids(),
)
snapshots = st.builds(
    ActiveRoleAssignmentSnapshot,
    assignment_id=st.uuids(),
    role_id=st.uuids(),
    role_code=st.text(),
    scope_type=st.sampled_from(list(ScopeType)),
    scope_organization_id=st.none() | st.uuids(),
    scope_project_group_id=st.none() | st.uuids(),
    scope_project_id=st.none() | st.uuids(),
    expires_at=st.none() | aware_datetimes,
)
accesses = st.builds(
    UserAccessChangedKafkaEvent,
    user_id=st.uuids(),
    company_id=st.none() | st.uuids(),
    change_reason=st.sampled_from(list(AccessChangeReason)),
    active_assignments=st.lists(snapshots, max_size=4).map(tuple),
    version=versions,
)


def decodes_or_violates(value: bytes | None) -> None:
    for decoder in (decode_membership_changed, decode_access_changed):
        outcome: Envelope[Any] | ContractViolation
        try:
            outcome = decoder(value)
        except ContractViolation as violation:
            outcome = violation
        if isinstance(outcome, ContractViolation):
            assert outcome.path.startswith("$")
            assert outcome.reason
        else:
            assert isinstance(outcome, Envelope)


@fuzz
@given(st.binary(max_size=512))
def test_arbitrary_bytes(value: bytes) -> None:
    decodes_or_violates(value)


@fuzz
@given(json_values)
def test_arbitrary_json(value: object) -> None:
    decodes_or_violates(json.dumps(value).encode())


@fuzz
@given(envelope_like)
def test_arbitrary_envelope_shaped_objects(value: dict[str, Any]) -> None:
    decodes_or_violates(json.dumps(value).encode())


def _paths(node: object, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    found: list[tuple[str | int, ...]] = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += _paths(child, (*prefix, index))
    return found


@fuzz
@given(st.data(), accesses | memberships)
def test_valid_records_with_one_value_corrupted(
    data: st.DataObject, payload: UserAccessChangedKafkaEvent | AgentMembershipChanged
) -> None:
    raw = json.loads(encode(envelope_for(payload)))
    path = data.draw(st.sampled_from(_paths(raw)))
    parent: Any = raw
    for step in path[:-1]:
        parent = parent[step]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(json_values)
    decodes_or_violates(json.dumps(raw).encode())


@fuzz
@given(memberships, st.uuids(), st.none() | st.text())
def test_any_valid_membership_round_trips(
    payload: AgentMembershipChanged, message_id: uuid.UUID, correlation_id: str | None
) -> None:
    envelope = msgspec.structs.replace(
        envelope_for(payload, correlation_id=correlation_id), message_id=message_id
    )

    assert decode_membership_changed(encode(envelope)) == envelope


@fuzz
@given(accesses)
def test_any_valid_access_snapshot_round_trips(payload: UserAccessChangedKafkaEvent) -> None:
    envelope = envelope_for(payload)

    assert decode_access_changed(encode(envelope)) == envelope
