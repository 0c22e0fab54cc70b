"""Facts of the topic catalogue that other services and infra rely on."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import msgspec
import pytest

from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    CATALOGUE,
    IDENTITY_MEMBERSHIP_DLQ,
    REWARDS_MEMBERSHIP_CONSUMER_GROUP,
    USER_ACCESS_CHANGED,
    AgentMembershipChanged,
    Envelope,
    Topic,
    UserAccessChangedKafkaEvent,
    encode,
    kafka_key,
)


@pytest.mark.parametrize(
    ("topic", "name", "key_field", "event_type"),
    [
        (USER_ACCESS_CHANGED, "pin.identity.access.v1", "UserId", "UserAccessChanged"),
        (
            AGENT_MEMBERSHIP_CHANGED,
            "pin.identity.agent-membership-changed.v1",
            "AgentUserId",
            "AgentMembershipChanged",
        ),
    ],
    ids=["user-access-changed", "agent-membership-changed"],
)
def test_event_topic(topic: Topic, name: str, key_field: str, event_type: str) -> None:
    assert topic.name == name
    assert topic.partitions == 3
    assert topic.key_field == key_field
    assert topic.event_type == event_type
    assert topic.contract_version == 1
    assert topic.dead_letter_of is None


def test_membership_dlq_keeps_the_original_key() -> None:
    assert IDENTITY_MEMBERSHIP_DLQ.name == "pin.rewards.identity-membership-dlq.v1"
    assert IDENTITY_MEMBERSHIP_DLQ.partitions == 3
    assert IDENTITY_MEMBERSHIP_DLQ.dead_letter_of == AGENT_MEMBERSHIP_CHANGED.name
    assert IDENTITY_MEMBERSHIP_DLQ.key_field == AGENT_MEMBERSHIP_CHANGED.key_field


def test_catalogue_values_are_the_published_ones() -> None:
    # Every field of every topic, written out: the declarations derive them from the event
    # classes, and infra, the charts and other teams rely on these exact values.
    assert {
        t.name: (
            t.partitions,
            t.key_field,
            t.event_type,
            t.contract_version,
            t.max_message_bytes,
            t.dead_letter_of,
        )
        for t in CATALOGUE
    } == {
        "pin.identity.access.v1": (3, "UserId", "UserAccessChanged", 1, 8_388_608, None),
        "pin.identity.agent-membership-changed.v1": (
            3,
            "AgentUserId",
            "AgentMembershipChanged",
            1,
            1_048_576,
            None,
        ),
        "pin.rewards.identity-membership-dlq.v1": (
            3,
            "AgentUserId",
            "AgentMembershipChanged",
            1,
            1_048_576,
            "pin.identity.agent-membership-changed.v1",
        ),
    }


@pytest.mark.parametrize("event", [UserAccessChangedKafkaEvent, AgentMembershipChanged])
def test_the_key_and_aggregate_fields_of_an_event_name_its_uuid_fields(event: Any) -> None:
    types = {f.name: f.type for f in msgspec.structs.fields(event)}
    assert types[event.KEY_FIELD] is UUID
    assert types[event.AGGREGATE_ID_FIELD] is UUID


def test_catalogue() -> None:
    assert CATALOGUE == (USER_ACCESS_CHANGED, AGENT_MEMBERSHIP_CHANGED, IDENTITY_MEMBERSHIP_DLQ)
    assert len({topic.name for topic in CATALOGUE}) == len(CATALOGUE)
    assert REWARDS_MEMBERSHIP_CONSUMER_GROUP == "pin-rewards-identity-membership"


def test_key_field_is_what_kafka_key_uses(
    access_envelope: Envelope[UserAccessChangedKafkaEvent],
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    pairs: list[tuple[Any, Envelope[Any]]] = [
        (USER_ACCESS_CHANGED, access_envelope),
        (AGENT_MEMBERSHIP_CHANGED, membership_envelope),
    ]
    for topic, envelope in pairs:
        payload = json.loads(encode(envelope))["Payload"]
        assert kafka_key(envelope) == payload[topic.key_field].encode()


def test_aggregate_ids_are_the_specs(
    access_envelope: Envelope[UserAccessChangedKafkaEvent],
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    assert access_envelope.aggregate_id == str(access_envelope.payload.user_id)
    assert membership_envelope.aggregate_id == str(membership_envelope.payload.membership_id)
    assert membership_envelope.aggregate_type == "AgentMembership"
