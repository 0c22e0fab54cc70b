"""Partitions added to a topic while the relay publishes it (real PostgreSQL, real Kafka).

The catalogue's partition count is the contract: the relay names each record's partition
by it, so a topic grown from 3 to 6 partitions mid-flow moves no key. A reader from offset 0
finds every key's records on one partition, versions never going backwards, and the last
record of each key its final version; a live consumer reads the same order.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

import msgspec
import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions
from prometheus_client import CollectorRegistry
from relay_support import RelayFactory, RelayThread, outbox_count

from identity_fanout.outbox.writer import OutboxMessage, outbox_message
from identity_fanout.schema import OUTBOX
from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    USER_ACCESS_CHANGED,
    AccessChangeReason,
    AgentMembershipChanged,
    AgentMembershipStatus,
    Topic,
    UserAccessChangedKafkaEvent,
    envelope_for,
    key_partition,
)
from pin_runtime.kafka import create_admin
from pin_testkit.records import end_offsets, read_topic
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

KEYS = 300
GROWN = 6


def change(contract: Topic, key: uuid.UUID, version: int) -> OutboxMessage:
    """Version `version` of the aggregate keyed `key`, as the fan-out job writes it."""
    if contract.event_type == USER_ACCESS_CHANGED.event_type:
        return outbox_message(
            envelope_for(
                UserAccessChangedKafkaEvent(
                    user_id=key,
                    company_id=key,
                    change_reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED.value,
                    active_assignments=(),
                    version=version,
                ),
                correlation_id="partitions-test",
            ),
            contract,
        )
    return outbox_message(
        envelope_for(
            AgentMembershipChanged(
                membership_id=key,
                agent_user_id=key,
                company_id=key,
                status=AgentMembershipStatus.ACTIVE.value,
                version=version,
                joined_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
            ),
            correlation_id="partitions-test",
        ),
        contract,
    )


class _Versioned(msgspec.Struct):
    Version: int


def version_of(value: bytes | None) -> int:
    assert value is not None
    return msgspec.json.decode(value, type=_Versioned).Version


def grow(admin: AdminClient, topic: str, partitions: int) -> None:
    """Add partitions as an operator would (kafka-topics --alter)."""
    for future in admin.create_partitions([NewPartitions(topic, partitions)]).values():
        future.result(30)
    wait_until(
        lambda: len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == partitions,
        30,
        f"{topic} has {partitions} partitions",
    )


@pytest.mark.parametrize(
    "contract", [USER_ACCESS_CHANGED, AGENT_MEMBERSHIP_CHANGED], ids=["access", "membership"]
)
def test_partitions_added_mid_flow_move_no_key_and_reverse_no_version(
    make_relay: RelayFactory,
    identity_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    contract: Topic,
) -> None:
    name = kafka_topic(partitions=contract.partitions)
    topic = replace(contract, name=name)
    keys = [uuid.uuid4() for _ in range(KEYS)]
    registry = CollectorRegistry()
    admin = create_admin(kafka_bootstrap, client_id="identity-fanout-test-admin")
    versions = iter(range(1, 1000))

    def wave() -> int:
        """One more version of every key, in one transaction, published by the relay."""
        version = next(versions)
        with psycopg.connect(identity_dsn) as conn:
            OUTBOX.write(conn, [change(topic, key, version) for key in keys])
        wait_until(lambda: outbox_count(identity_dsn) == 0, 60, "the relay published the wave")
        return version

    def relay_saw_growth() -> bool:
        """The relay's producer knows the new partitions: it reports the count it observed,
        or (unpinned) it has put records there already."""
        observed = registry.get_sample_value("identity_outbox_topic_partitions", {"topic": name})
        new_partitions = [o for p, o in end_offsets(kafka_bootstrap, name).items() if p >= 3]
        return observed == GROWN or any(new_partitions)

    # The test's topic under the catalogue's count, as the service's topics are.
    with RelayThread(make_relay(registry=registry, partitions={name: contract.partitions})):
        for _ in range(3):
            wave()
        grow(admin, name, GROWN)
        # More changes while the relay's metadata catches up with the topic (10 s), then more.
        wait_until(lambda: wave() and relay_saw_growth(), 90, "the relay saw 6 partitions")
        final = max(wave(), wave())

    by_key: dict[bytes, list[tuple[int, int]]] = defaultdict(list)  # key -> (partition, version)
    for record in sorted(read_topic(kafka_bootstrap, name), key=lambda r: (r.partition, r.offset)):
        assert record.key is not None
        by_key[record.key].append((record.partition, version_of(record.value)))
    assert len(by_key) == KEYS
    moved = {k for k, seen in by_key.items() if len({p for p, _ in seen}) > 1}
    assert not moved, f"{len(moved)} of {KEYS} keys on more than one partition"
    for key, seen in by_key.items():
        assert {p for p, _ in seen} == {key_partition(key, contract.partitions)}
        versions_seen = [v for _, v in seen]
        assert versions_seen == sorted(versions_seen), key
        assert versions_seen[-1] == final, key


def test_a_topic_with_fewer_partitions_than_the_catalogue_pauses_until_it_has_them(
    make_relay: RelayFactory,
    identity_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
) -> None:
    name = kafka_topic(partitions=3)
    topic = replace(USER_ACCESS_CHANGED, name=name, partitions=GROWN)  # the catalogue says 6
    keys = [uuid.uuid4() for _ in range(50)]
    registry = CollectorRegistry()
    relay = make_relay(registry=registry, partitions={name: GROWN})
    with psycopg.connect(identity_dsn) as conn:
        OUTBOX.write(conn, [change(topic, key, 1) for key in keys])

    def paused() -> float | None:
        return registry.get_sample_value(
            "identity_outbox_relay_paused", {"reason": "partition-count", "topic": name}
        )

    with RelayThread(relay):
        wait_until(lambda: paused() == 1, 30, "the relay paused for the partition count")
        assert registry.get_sample_value("identity_outbox_topic_partitions", {"topic": name}) == 3
        assert outbox_count(identity_dsn) == len(keys)  # nothing published, nothing set aside
        pause = relay.pause
        assert pause is not None
        assert pause.failure.reason == "partition-count"
        grow(create_admin(kafka_bootstrap, client_id="identity-fanout-test-admin"), name, GROWN)
        wait_until(lambda: outbox_count(identity_dsn) == 0, 60, "published once it has 6")
        wait_until(lambda: paused() == 0, 30, "the pause lifted")
    records = read_topic(kafka_bootstrap, name)
    assert {(r.key, r.partition) for r in records} == {
        (str(k).encode(), key_partition(str(k).encode(), GROWN)) for k in keys
    }
