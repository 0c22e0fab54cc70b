"""contracts/examples/access_consumer.py, the starting point for a consumer team, against a
real broker: it applies, deduplicates, fails closed, refuses a bad record and commits."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from confluent_kafka import Consumer, Producer

from pin_contracts import (
    AccessChangeReason,
    ActiveRoleAssignmentSnapshot,
    ScopeType,
    UserAccessChangedKafkaEvent,
    encode,
    envelope_for,
    headers_for,
    kafka_key,
)
from pin_contracts.access_cache import AccessDecision, Decision
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "access_consumer.py"


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("access_consumer_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations by name
    spec.loader.exec_module(module)
    return module


def access(user: uuid.UUID, version: int, reason: str, *codes: str) -> UserAccessChangedKafkaEvent:
    return UserAccessChangedKafkaEvent(
        user_id=user,
        company_id=None,
        change_reason=reason,
        active_assignments=tuple(
            ActiveRoleAssignmentSnapshot(
                assignment_id=uuid.uuid4(),
                role_id=uuid.uuid4(),
                role_code=code,
                scope_type=ScopeType.COMPANY,
            )
            for code in codes
        ),
        version=version,
    )


def test_the_example_consumer_applies_deduplicates_refuses_and_commits(
    kafka_bootstrap: str, kafka_topic: Callable[..., str]
) -> None:
    module = example()
    topic = kafka_topic(partitions=3)
    user = uuid.uuid4()
    granted = envelope_for(access(user, 1, AccessChangeReason.ROLE_ASSIGNMENT_GRANTED, "viewer"))
    revoked = envelope_for(access(user, 2, AccessChangeReason.ROLE_ASSIGNMENT_REVOKED))
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for envelope in (granted, revoked, revoked):  # the revocation delivered twice
        producer.produce(
            topic, key=kafka_key(envelope), value=encode(envelope), headers=headers_for(envelope)
        )
    producer.produce(topic, key=str(user).encode(), value=b"{not the contract")
    assert producer.flush(30) == 0

    group = f"example-{uuid.uuid4().hex[:8]}"
    invalidated: list[Decision] = []
    kafka = Consumer(module.consumer_config(kafka_bootstrap, group))
    kafka.subscribe([topic])
    loop = module.AccessConsumer(kafka, on_invalidated=invalidated.append)
    decisions: list[Decision] = []

    def handled_all() -> bool:
        decisions.extend(loop.poll_once(0.5))
        refused: int = loop.refused
        return len(decisions) + refused >= 4

    try:
        wait_until(handled_all, 60, "four records handled")
    finally:
        kafka.close()
    assert [d.decision for d in decisions] == [
        AccessDecision.APPLIED,
        AccessDecision.APPLIED,
        AccessDecision.DUPLICATE,
    ]
    assert loop.refused == 1
    assert invalidated == []
    cached = loop.cache.get(user)
    assert cached is not None
    assert not cached.holds("viewer", ScopeType.COMPANY)  # the revocation is the snapshot

    # Committed after applying: the group's next member starts after all four.
    again = Consumer(module.consumer_config(kafka_bootstrap, group))
    again.subscribe([topic])
    try:
        fresh = module.AccessConsumer(again)
        assert [fresh.poll_once(1.0) for _ in range(3)] == [[], [], []]
        assert fresh.refused == 0
    finally:
        again.close()
