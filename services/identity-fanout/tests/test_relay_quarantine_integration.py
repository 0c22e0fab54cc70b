"""Sizes and quarantine of the outbox relay, against a real PostgreSQL and a real broker.

Topics are created with the catalogue's `max.message.bytes` (`Topic.config()`), as an
operator's cluster has them; rows written for the catalogue topic are pointed at this test's
topic by an UPDATE, the way the membership relay test does it.
"""

from __future__ import annotations

import io
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

# Re-exported by confluent_kafka.admin without __all__; mypy strict wants the defining modules.
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType
from prometheus_client import CollectorRegistry
from psycopg.rows import TupleRow

from identity_fanout.enqueue import set_role_permissions
from identity_fanout.membership import join_agency
from identity_fanout.outbox import OutboxMessage, outbox_message, write_outbox
from identity_fanout.quarantine import list_quarantined, retry_all, retry_quarantined
from identity_fanout.relay import OutboxRelay
from identity_fanout.settings import RELAY_MESSAGE_MAX_BYTES
from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    USER_ACCESS_CHANGED,
    AccessChangeReason,
    AgentMembershipChanged,
    Envelope,
    ScopeType,
    Topic,
    UserAccessChangedKafkaEvent,
    decode_access_changed,
    envelope_for,
)
from pin_runtime.http import ComponentState
from pin_runtime.kafka import create_admin
from pin_runtime.logging import JsonFormatter
from pin_testkit.seeding import Assignment, add_assignments, add_permissions, add_role

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
MIB = 1024 * 1024


# -- helpers ------------------------------------------------------------------------------


def access_event(
    user_id: uuid.UUID | None = None, version: int = 1
) -> Envelope[UserAccessChangedKafkaEvent]:
    return envelope_for(
        UserAccessChangedKafkaEvent(
            user_id=user_id or uuid.uuid4(),
            company_id=uuid.uuid4(),
            change_reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED.value,
            active_assignments=(),
            version=version,
        ),
        correlation_id="quarantine-test",
    )


def access_topic(name: str) -> Topic:
    """The access topic's contract under a test's unique name."""
    return replace(USER_ACCESS_CHANGED, name=name)


def opaque(topic: str, key: uuid.UUID, size: int, event_type: str) -> OutboxMessage:
    """A row of `size` incompressible bytes: what a limit sees, whatever the codec."""
    return OutboxMessage(
        topic=topic,
        key=str(key),
        value=os.urandom(size),
        headers=(),
        message_id=uuid.uuid4(),
        event_type=event_type,
    )


def write(dsn: str, messages: list[OutboxMessage]) -> None:
    with psycopg.connect(dsn) as conn:  # one transaction, committed on exit
        write_outbox(conn, messages)


def outbox_count(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM identity.outbox").fetchone()
    assert row is not None
    return int(row[0])


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"not within {timeout}s: {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def read_all(
    bootstrap: str, topic: str, partitions: int = 3, timeout: float = 60.0
) -> list[Message]:
    """Every record of `topic`, from the beginning to the end of each partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"quarantine-test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    records: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"not at the end of {topic} within {timeout}s"
            message = consumer.poll(min(remaining, 1.0))
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(message.partition() or 0)
                continue
            records.append(message)
    finally:
        consumer.close()
    return records


def raise_topic_limit(bootstrap: str, topic: str, limit: int) -> None:
    """What an operator does: `kafka-configs --alter --add-config max.message.bytes=...`."""
    admin = create_admin(bootstrap, client_id="quarantine-test")
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes",
                str(limit),
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


class RelayThread:
    """`relay.run(stop)` in a thread, as the worker runs it."""

    def __init__(self, relay: OutboxRelay) -> None:
        self.relay = relay
        self.stop = threading.Event()
        self.thread = threading.Thread(target=relay.run, args=(self.stop,), name="relay-test")

    def __enter__(self) -> RelayThread:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "relay did not stop within 30s"


RelayFactory = Callable[..., OutboxRelay]


@pytest.fixture
def make_relay(relay_dsn: str, kafka_bootstrap: str) -> Iterator[RelayFactory]:
    """Relays logged in as the relay's runtime role."""
    relays: list[OutboxRelay] = []

    def make(**overrides: Any) -> OutboxRelay:
        options: dict[str, Any] = {
            "dsn": relay_dsn,
            "bootstrap": kafka_bootstrap,
            "registry": CollectorRegistry(),
            "delivery_timeout": 20.0,
            "poll_interval": 0.2,
            "lock_retry_interval": 0.2,
            "backoff_initial": 0.1,
            "backoff_maximum": 0.5,
        } | overrides
        relay = OutboxRelay(**options)
        relays.append(relay)
        return relay

    yield make
    for relay in relays:
        relay.close()


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(service="identity-fanout"))
    logger = logging.getLogger("identity_fanout")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(previous)


def log_lines(stream: io.StringIO, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [line for line in lines if line.get("event") == event]


# -- sizes --------------------------------------------------------------------------------


def test_a_user_with_20000_assignments_gets_their_access_event(
    *,
    db: Conn,
    identity_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    make_relay: RelayFactory,
    operator_db: Conn,
) -> None:
    topic = kafka_topic(partitions=3, config=USER_ACCESS_CHANGED.config())
    company = uuid.uuid4()
    role = add_role(db, "big-holder", company_id=company, permissions=["p.read"])
    projects = [add_role(db, f"project-{i}", company_id=company) for i in range(20)]
    user, bystander = uuid.uuid4(), uuid.uuid4()
    groups = [uuid.uuid4() for _ in range(50)]

    def assignments() -> Iterator[Assignment]:
        yield Assignment(role_id=role, user_id=user, company_id=company)
        yield Assignment(role_id=role, user_id=bystander, company_id=company)
        for n in range(19_999):
            yield Assignment(
                role_id=projects[n % len(projects)],
                user_id=user,
                company_id=company,
                scope_type=ScopeType.PROJECT.value,
                scope_organization_id=company,
                scope_project_group_id=groups[n % len(groups)],
                scope_project_id=uuid.uuid4(),
            )

    add_assignments(db, assignments())
    add_permissions(db, ["p.write"])
    set_role_permissions(operator_db, role, ["p.read", "p.write"], inline_threshold=10)
    db.execute("UPDATE identity.outbox SET topic = %s", (topic,))
    registry = CollectorRegistry()
    relay = make_relay(registry=registry)  # the defaults: zstd, message.max.bytes 16 MiB

    assert relay.run_once() == 2
    assert outbox_count(identity_dsn) == 0
    assert sample(registry, "identity_outbox_quarantined_total") == 0

    records = {r.key(): r for r in read_all(kafka_bootstrap, topic)}
    big = records[str(user).encode()]
    value = big.value() or b""
    assert len(value) > 1_000_000  # above the broker's default limit: the sizes are deliberate
    assert len(value) < RELAY_MESSAGE_MAX_BYTES
    snapshot = decode_access_changed(value).payload.active_assignments
    assert len(snapshot) == 20_000
    assert str(bystander).encode() in records


# -- quarantine ---------------------------------------------------------------------------


def test_rows_over_the_limits_are_quarantined_and_the_rows_behind_them_flow(
    *,
    identity_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    make_relay: RelayFactory,
    json_logs: io.StringIO,
    operator_dsn: str,
) -> None:
    access = kafka_topic(partitions=3, config=USER_ACCESS_CHANGED.config())
    membership = kafka_topic(partitions=3, config=AGENT_MEMBERSHIP_CHANGED.config())
    poisoned_user, agent = uuid.uuid4(), uuid.uuid4()
    # Over the producer's message.max.bytes (16 MiB): produce() refuses it at once.
    too_big_access = opaque(
        access, poisoned_user, RELAY_MESSAGE_MAX_BYTES + MIB, UserAccessChangedKafkaEvent.EVENT_TYPE
    )
    # Under the producer's limit, over the membership topic's 1 MiB even compressed: the
    # broker refuses it in the delivery report.
    too_big_membership = opaque(membership, agent, 2 * MIB, AgentMembershipChanged.EVENT_TYPE)
    before = [outbox_message(access_event(), access_topic(access)) for _ in range(3)]
    later_of_same_user = outbox_message(access_event(poisoned_user, 2), access_topic(access))
    behind = [outbox_message(access_event(), access_topic(access)) for _ in range(3)]
    write(identity_dsn, [*before, too_big_access, too_big_membership])
    write(identity_dsn, [later_of_same_user, *behind])
    with psycopg.connect(identity_dsn, autocommit=True) as conn:
        join_agency(conn, uuid.uuid4(), uuid.uuid4())  # a membership event recorded after
        conn.execute(
            "UPDATE identity.outbox SET topic = %s WHERE topic = %s",
            (membership, AGENT_MEMBERSHIP_CHANGED.name),
        )
        ids = [r[0] for r in conn.execute("SELECT id FROM identity.outbox ORDER BY id")]
    registry, state = CollectorRegistry(), ComponentState()
    relay = make_relay(registry=registry, state=state)

    with RelayThread(relay):
        took = wait_until(lambda: outbox_count(identity_dsn) == 0, 30, "the outbox drained")
    assert took < 10
    assert state().status == "ok"  # a quarantined row is not an outage

    with psycopg.connect(operator_dsn, autocommit=True) as conn:
        quarantined = list_quarantined(conn)
    assert [(q.outbox_id, q.topic, q.key) for q in quarantined] == [
        (ids[3], access, str(poisoned_user)),
        (ids[4], membership, str(agent)),
    ]
    refused_by_client, refused_by_broker = quarantined
    for row in quarantined:
        assert (row.error_code, row.error_reason, row.attempts) == (
            "MSG_SIZE_TOO_LARGE",
            "too-large",
            1,
        )
        assert row.first_failed_at == row.last_failed_at
    assert refused_by_client.size == RELAY_MESSAGE_MAX_BYTES + MIB
    assert refused_by_client.message_id == too_big_access.message_id
    # produce() refused one at once; the broker's delivery report the other.
    assert refused_by_client.error_message.startswith("Unable to produce message")
    assert refused_by_broker.error_message == "Broker: Message size too large"

    access_records = read_all(kafka_bootstrap, access)
    delivered = {r.value() for r in access_records}
    assert delivered == {m.value for m in [*before, later_of_same_user, *behind]}
    # The later event of the quarantined user still went out.
    mine = [r for r in access_records if r.key() == str(poisoned_user).encode()]
    assert [decode_access_changed(r.value() or b"").payload.version for r in mine] == [2]
    membership_records = read_all(kafka_bootstrap, membership)
    assert len(membership_records) == 1  # the join recorded after the refused row

    assert (
        sample(registry, "identity_outbox_quarantined_total", topic=access, reason="too-large") == 1
    )
    assert (
        sample(registry, "identity_outbox_quarantined_total", topic=membership, reason="too-large")
        == 1
    )
    assert sample(registry, "identity_outbox_quarantine_rows", topic=access) == 1
    assert sample(registry, "identity_outbox_quarantine_rows", topic=membership) == 1

    lines = log_lines(json_logs, "outbox row quarantined")
    assert len(lines) == 2
    by_topic = {line["topic"]: line for line in lines}
    assert by_topic[access]["userId"] == str(poisoned_user)
    assert by_topic[access]["outboxId"] == ids[3]
    assert by_topic[access]["errorCode"] == "MSG_SIZE_TOO_LARGE"
    assert by_topic[access]["reason"] == "too-large"
    assert by_topic[membership]["agentUserId"] == str(agent)
    assert by_topic[membership]["level"] == "ERROR"


def test_retry_counts_attempts_and_delivers_once_the_limit_is_raised(
    identity_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    make_relay: RelayFactory,
    operator_dsn: str,
) -> None:
    topic = kafka_topic(partitions=3, config={"max.message.bytes": str(MIB)})
    user = uuid.uuid4()
    row = opaque(topic, user, 2 * MIB, UserAccessChangedKafkaEvent.EVENT_TYPE)
    write(identity_dsn, [row])
    small = make_relay(message_max_bytes=MIB)

    assert small.run_once() == 0
    assert small.last_round is not None
    assert small.last_round.quarantined == 1
    with psycopg.connect(operator_dsn, autocommit=True) as conn:
        [first] = list_quarantined(conn)
        # Retried before the cause is fixed: refused again, attempts count on.
        requeued = retry_quarantined(conn, first.id)
        assert requeued.quarantine_id == first.id
        assert requeued.outbox_id > first.outbox_id  # the tail of the outbox, a new id
        assert small.run_once() == 0
        [second] = list_quarantined(conn)
    assert second.attempts == 2
    assert second.first_failed_at == first.first_failed_at
    assert second.last_failed_at > first.last_failed_at
    assert second.outbox_id == requeued.outbox_id
    small.close()

    # The operator raises both limits, then retries everything.
    raise_topic_limit(kafka_bootstrap, topic, 4 * MIB)
    large = make_relay(message_max_bytes=4 * MIB)
    with psycopg.connect(operator_dsn, autocommit=True) as conn:
        [back] = retry_all(conn)
        assert back.attempts == 2
        assert list_quarantined(conn) == []
    assert large.run_once() == 1
    assert outbox_count(identity_dsn) == 0
    [record] = read_all(kafka_bootstrap, topic)
    assert record.key() == str(user).encode()
    assert record.value() == row.value
