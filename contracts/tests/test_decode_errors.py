"""Every bad record value is a ContractViolation naming where it went wrong."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from pin_contracts import (
    AgentMembershipChanged,
    ContractError,
    ContractViolation,
    Envelope,
    UserAccessChangedKafkaEvent,
    decode_access_changed,
    decode_membership_changed,
    encode,
)

Mutation = Callable[[dict[str, Any]], object]


def _delete(*path: str) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        target = raw
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


def _set(value: object, *path: str) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        target = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "path", "reason"),
    [
        (_delete("Payload", "AgentUserId"), "$.Payload.AgentUserId", "missing required field"),
        (_delete("Payload", "CompanyId"), "$.Payload.CompanyId", "missing required field"),
        (_delete("Payload", "JoinedAt"), "$.Payload.JoinedAt", "missing required field"),
        (_delete("MessageId"), "$.MessageId", "missing required field"),
        (_delete("Payload"), "$.Payload", "missing required field"),
        (_set("7", "Payload", "Version"), "$.Payload.Version", "Expected `int`, got `str`"),
        (_set(0, "Payload", "Version"), "$.Payload.Version", ">= 1"),
        (_set(2**63, "Payload", "Version"), "$.Payload.Version", "<= 9223372036854775807"),
        (_set(10**400, "Payload", "Version"), "$.Payload.Version", "Expected `int` <="),
        (_set(1.5, "Version"), "$.Version", "Expected `int`, got `float`"),
        (_set(True, "ContractVersion"), "$.ContractVersion", "got `bool`"),
        (_set("", "Payload", "AgentUserId"), "$.Payload.AgentUserId", "Invalid UUID"),
        (_set(None, "Payload", "CompanyId"), "$.Payload.CompanyId", "got `null`"),
        (_set(1, "Payload", "Status"), "$.Payload.Status", "Expected `str`, got `int`"),
        (_set(["Left"], "Payload", "Reason"), "$.Payload.Reason", "got `array`"),
        (
            _set("2025-03-01T12:00:00", "Payload", "JoinedAt"),
            "$.Payload.JoinedAt",
            "timezone",
        ),
        (_set("yesterday", "OccurredAt"), "$.OccurredAt", "Invalid RFC3339"),
        (_set([], "Payload"), "$.Payload", "Expected `object`, got `array`"),
        (_set("AccessChanged", "EventType"), "$.EventType", "expected 'AgentMembershipChanged'"),
    ],
)
def test_violations_name_their_path(
    membership_envelope: Envelope[AgentMembershipChanged],
    mutate: Mutation,
    path: str,
    reason: str,
) -> None:
    raw = json.loads(encode(membership_envelope))
    mutate(raw)

    with pytest.raises(ContractViolation) as caught:
        decode_membership_changed(json.dumps(raw).encode())

    assert caught.value.path == path
    assert reason in caught.value.reason
    assert str(caught.value) == f"{path}: {caught.value.reason}"
    assert isinstance(caught.value, ContractError)


def test_nested_snapshot_errors_carry_the_index(
    access_envelope: Envelope[UserAccessChangedKafkaEvent],
) -> None:
    raw = json.loads(encode(access_envelope))
    del raw["Payload"]["ActiveAssignments"][1]["RoleCode"]

    with pytest.raises(ContractViolation) as caught:
        decode_access_changed(json.dumps(raw).encode())

    assert caught.value.path == "$.Payload.ActiveAssignments[1].RoleCode"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "tombstone"),
        (b"", "not valid UTF-8 JSON"),
        (b"not json", "not valid UTF-8 JSON"),
        (b"\xff\xfe\x00{", "not valid UTF-8 JSON"),
        (b'{"MessageId": "\xff"}', ""),
        (b"{}", "missing required field `MessageId`"),
        (b"[]", "Expected `object`, got `array`"),
        (b"null", "got `null`"),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "nested too deeply"),
        (b'"unterminated', "truncated"),
    ],
)
def test_undecodable_values_are_violations_at_the_root(value: bytes | None, reason: str) -> None:
    with pytest.raises(ContractViolation) as caught:
        decode_membership_changed(value)

    assert caught.value.path.startswith("$")
    assert reason in caught.value.reason


def test_a_non_bytes_value_is_a_violation() -> None:
    with pytest.raises(ContractViolation) as caught:
        decode_access_changed("{}")  # type: ignore[arg-type]

    assert caught.value.reason == "record value must be bytes, got str"


def test_an_access_event_is_not_a_membership_event(
    access_envelope: Envelope[UserAccessChangedKafkaEvent],
) -> None:
    with pytest.raises(ContractViolation) as caught:
        decode_membership_changed(encode(access_envelope))

    assert caught.value.path.startswith("$.Payload.")
